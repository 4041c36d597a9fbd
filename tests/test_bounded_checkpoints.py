"""Hostile checkpoints: only regular files are read, the config's model is checked against the
file's weights before anything is built, and evaluation stops episodes that do not end.

A checksum only catches accidents: anyone can write a valid file. Each file
here is valid as far as the format goes and was built to make ``evaluate``
take gigabytes, block forever or run without end.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from helpers_bounded import run_capped

from marl_runner import EnvRunner, RunnerConfig, save_checkpoint
from marl_runner.checkpoint import (
    CheckpointError,
    load_checkpoint,
    restore_checkpoint,
    write_checkpoint,
)
from marl_runner.checkpoint.evaluation import (
    DEFAULT_MAX_EPISODE_STEPS,
    EvaluationError,
    evaluate_checkpoint,
)
from marl_runner.envs import MultiAgentEnv, register_env

TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"


class CountingEnv(MultiAgentEnv):
    """Two agents, one float obs (the step count), episodes of ``episode_len`` steps; nothing
    is allocated per step, so a file may ask for any length."""

    possible_agents = ["a", "b"]

    def __init__(self, episode_len: int) -> None:
        self.episode_len, self.steps = episode_len, 0
        space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))

    def _obs(self) -> dict[str, np.ndarray]:
        return dict.fromkeys(self.possible_agents, np.array([self.steps], np.float32))

    def reset(self, seed=None, options=None):
        self.steps = 0
        return self._obs(), {agent: {} for agent in self.possible_agents}

    def step(self, actions):
        self.steps += 1
        done = self.steps >= self.episode_len
        flags = {**dict.fromkeys(self.possible_agents, done), "__all__": done}
        rewards = dict.fromkeys(self.possible_agents, 1.0)
        infos = {agent: {} for agent in self.possible_agents}
        return self._obs(), rewards, flags, dict.fromkeys(flags, False), infos


register_env("bounded-counting", lambda cfg: CountingEnv(**cfg))


def saved(path: Path, data: dict[str, Any]) -> Path:
    with EnvRunner(RunnerConfig.from_dict(data)) as runner:
        return save_checkpoint(runner, path)


def rewritten(source: Path, target: Path, change) -> Path:
    """A copy of a checkpoint with its payload changed and a valid checksum."""
    payload = copy.deepcopy(load_checkpoint(source))
    change(payload)
    return write_checkpoint(payload, target)


@pytest.fixture(scope="module")
def tictactoe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "ttt.ckpt"
    return saved(path, {"env": TICTACTOE, "policies": {"shared": {"model": {"hidden": [8]}}}})


def test_a_symlink_to_dev_zero_and_a_fifo_are_refused_without_reading(tmp_path):
    """Case 6: /dev/zero was read until MemoryError, a FIFO blocked forever."""
    zero = tmp_path / "zero.ckpt"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.ckpt"
    os.mkfifo(fifo)
    result = run_capped(
        f"""
        from marl_runner.checkpoint import CheckpointError, load_checkpoint
        for path in ({str(zero)!r}, {str(fifo)!r}):
            try:
                load_checkpoint(path)
            except CheckpointError as exc:
                print(exc)
        """,
        cap_mib=1024,
        timeout_s=30,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    zero_line, fifo_line = result.stdout.splitlines()
    assert str(zero) in zero_line and "not a regular file (a character device)" in zero_line
    assert str(fifo) in fifo_line and "not a regular file (a FIFO)" in fifo_line
    assert result.peak_rss_mib < 300


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(tmp_path)


def test_a_model_larger_than_the_files_weights_is_refused_before_it_is_built(tictactoe, tmp_path):
    """Case 5: hidden [20000, 20000] in the config took 8.1 GB before the weights were
    checked against the model (two 20000x20000 float32 matrices, policy and value); the
    config check now refuses that size, so a size under its bound shows the weights check."""

    def huge(payload):
        payload["config"]["policies"]["shared"]["model"]["hidden"] = [4000, 4000]

    path = rewritten(tictactoe, tmp_path / "huge.ckpt", huge)
    result = run_capped(
        f"""
        from marl_runner.cli.app import main
        code = main(["evaluate", {str(path)!r}, "--episodes", "1"])
        print("EXIT", code)
        """,
        cap_mib=3072,
    )
    assert result.stdout.splitlines()[-1] == "EXIT 2", result.stderr[-3000:]
    assert str(path) in result.stderr and "policies.shared" in result.stderr
    assert "[4000, 8]" in result.stderr or "[4000, 4000]" in result.stderr
    assert result.peak_rss_mib < 300


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"type": "lstm"}, "model.encoder.0.weight"),  # another model type altogether
        ({"type": "mlp", "hidden": [8], "vf_share_layers": True}, "model.value_trunk"),
        ({"type": "mlp", "hidden": [9]}, "[9, ?]"),
    ],
)
def test_weights_that_do_not_fit_the_configs_model_name_the_weight(
    tictactoe, tmp_path, model, message
):
    def change(payload):
        payload["config"]["policies"]["shared"]["model"] = model

    path = rewritten(tictactoe, tmp_path / "other.ckpt", change)
    with pytest.raises(CheckpointError) as info:
        evaluate_checkpoint(path, episodes=1)
    assert message in str(info.value) and "policies.shared.weights" in str(info.value)


def test_a_config_whose_batch_cannot_fit_is_refused_before_building(tictactoe, tmp_path):
    def many(payload):
        payload["config"]["num_envs"] = 10_000_000

    path = rewritten(tictactoe, tmp_path / "many.ckpt", many)
    with pytest.raises(CheckpointError, match=r"many.ckpt.*num_envs 10,000,000"):
        restore_checkpoint(path)


@pytest.mark.parametrize(
    ("backend", "options"),
    [("subprocess", {"num_envs": 64, "num_workers": 64}), ("subprocess", {"num_envs": 64}),
     ("ray", {"num_envs": 64})],
)
def test_a_config_asking_for_more_env_processes_than_cores_is_refused(
    tictactoe, tmp_path, monkeypatch, backend, options
):
    """(Found by a probe.) A 65 KB file asking for 16 workers started 18 processes and
    took 2.5 GB: a file's config may start one env process per core. Overrides lift it."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def many(payload):
        payload["config"].update(vectorize=backend, **options)

    path = rewritten(tictactoe, tmp_path / "procs.ckpt", many)
    processes = options.get("num_workers", 64 if backend == "ray" else 2)
    if processes <= 2:  # subprocess's default: min(num_envs, cores)
        with restore_checkpoint(path, overrides=["num_envs=2"]) as runner:
            assert runner.sample().env_steps() > 0
        return
    with pytest.raises(CheckpointError, match=rf"procs.ckpt: .* asks for {processes} env processes"):
        restore_checkpoint(path)
    with restore_checkpoint(path, overrides=["vectorize=sync", "num_envs=2"]) as runner:
        assert runner.sample().env_steps() > 0
    # A count the caller set in overrides is theirs (found in review: it was refused too).
    from marl_runner.checkpoint import checkpoint_config

    asked = checkpoint_config(path, overrides=["num_envs=4", "num_workers=4"])
    assert (asked.num_envs, asked.num_workers) == (4, 4)


def test_weights_that_fit_restore_as_before(tictactoe):
    result = evaluate_checkpoint(tictactoe, episodes=2, seed=1)
    assert len(result.episodes) == 2


def test_episodes_longer_than_max_episode_steps_stop_evaluation(tmp_path, capsys):
    """Case 7: an env config from the file asking for 10**9-step episodes ran without end."""
    data = {
        "env": {"name": "bounded-counting", "config": {"episode_len": 10**9}},
        "policies": {"shared": {"model": {"hidden": [4]}}},
    }
    path = saved(tmp_path / "long.ckpt", data)
    with pytest.raises(
        EvaluationError, match=r"did not end within 30 env steps.*max_episode_steps=30"
    ):
        evaluate_checkpoint(path, episodes=2, max_episode_steps=30)
    from marl_runner.cli.app import main

    assert main(["evaluate", str(path), "--episodes", "2", "--max-episode-steps", "30"]) == 2
    err = capsys.readouterr().err
    assert "--max-episode-steps 30" in err and "episode_len" in err
    assert 1_000 <= DEFAULT_MAX_EPISODE_STEPS <= 1_000_000


def test_episodes_within_the_cap_are_evaluated(tmp_path):
    data = {
        "env": {"name": "bounded-counting", "config": {"episode_len": 30}},
        "policies": {"shared": {"model": {"hidden": [4]}}},
    }
    path = saved(tmp_path / "ok.ckpt", data)
    result = evaluate_checkpoint(path, episodes=2, max_episode_steps=30)
    assert [e.length for e in result.episodes] == [30, 30]


def test_a_checkpoint_of_subprocess_workers_is_evaluated_on_one_sub_env(tictactoe, tmp_path):
    """(Found in review.) Evaluation steps one sub-env: a file's num_workers: 2 was refused
    as more workers than that one sub-env."""

    def workers(payload):
        payload["config"].update(vectorize="subprocess", num_envs=2, num_workers=2)

    path = rewritten(tictactoe, tmp_path / "workers.ckpt", workers)
    result = evaluate_checkpoint(path, episodes=1, seed=1)
    assert len(result.episodes) == 1
