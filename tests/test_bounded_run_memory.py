"""Configs whose batch cannot fit in memory are refused by validate and sample alike, before
any sub-env beyond one is built (case 8: num_envs 10,000,000 or rollout_fragment_length
10**12 passed validate, and sample grew without end)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

import marl_runner.cli.common
from marl_runner.cli.app import main
from marl_runner.config import ConfigError, RunnerConfig
from marl_runner.config.memory import (
    BOOKKEEPING_ROW_BYTES,
    check_batch_memory,
    estimate_batch_memory,
    space_bytes,
)

TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"


def write(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"env": TICTACTOE, "policies": {"shared": {}}, **changes}))
    return path


@pytest.fixture(autouse=True)
def machine_of_1_5_gib(monkeypatch):
    """Every command here runs as on a machine where a process may use 1.5 GiB."""
    monkeypatch.setattr(marl_runner.cli.common, "memory_limit_bytes", lambda: 1536 << 20)


@pytest.mark.parametrize("command", ["validate", "sample"])
@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({"num_envs": 10_000_000}, "num_envs 10,000,000"),
        ({"rollout_fragment_length": 10**12}, "rollout_fragment_length 1,000,000,000,000"),
    ],
)
def test_a_batch_larger_than_the_machine_is_refused(tmp_path, capsys, command, changes, shown):
    """Refused from the config alone: no env is built, so this takes no time."""
    assert main([command, str(write(tmp_path, **changes))]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "one batch needs about" in err and shown in err and "1.5 GiB" in err
    assert "lower num_envs or rollout_fragment_length" in err


@pytest.mark.parametrize("command", ["validate", "sample"])
def test_the_agents_spaces_count_once_the_env_is_known(tmp_path, capsys, command):
    """Bookkeeping alone fits in 1.5 GiB (20M rows x 42 B = 0.8 GiB); with tictactoe's obs,
    next obs and action each row is 104 B (1.9 GiB), so both commands refuse it, having
    built one sub-env."""
    assert main([command, str(write(tmp_path, num_envs=100_000))]) == 2
    assert "policy 'shared': 20,000,000 rows x 104 B" in capsys.readouterr().err


def test_validate_prints_the_estimate(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path, num_envs=4, rollout_fragment_length=50))]) == 0
    out = capsys.readouterr().out
    assert "memory: one batch takes about 20.3 KiB per runner" in out and "1.5 GiB" in out
    assert "policy 'shared': 200 rows x 104 B" in out  # turn-taking: one row per env step


def test_estimate_rows_and_row_bytes():
    config = RunnerConfig.from_dict(
        {"env": "x:y", "policies": {"a": {}, "b": {}}, "num_envs": 3, "rollout_fragment_length": 10}
    )
    box = gym.spaces.Box(0, 1, (4, 5), np.float32)
    image = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    obs = gym.spaces.Dict({"observation": image, "action_mask": gym.spaces.MultiBinary(7)})
    assert space_bytes(box) == 80 and space_bytes(obs) == 192 + 7
    act = gym.spaces.Discrete(5)
    agents = [("a", box, act), ("a", box, act), ("b", obs, act)]
    parallel = estimate_batch_memory(config, agents, all_agents_act=True)
    assert parallel.rows == {"a": 60, "b": 30}  # every agent acts every step
    assert parallel.row_bytes == {"a": 160 + 8 + BOOKKEEPING_ROW_BYTES, "b": 398 + 8 + 42}
    turns = estimate_batch_memory(config, agents, all_agents_act=False)
    assert turns.rows == {"a": 20, "b": 10}  # one agent per step, shared out
    check_batch_memory(parallel, parallel.total_bytes)
    with pytest.raises(ConfigError, match="one batch needs about"):
        check_batch_memory(parallel, parallel.total_bytes - 1)
    without_new_obs = dataclasses.replace(config, exclude_columns=["new_obs"])
    lean = estimate_batch_memory(without_new_obs, agents, all_agents_act=True)
    assert lean.row_bytes == {"a": 80 + 8 + BOOKKEEPING_ROW_BYTES, "b": 199 + 8 + 42}


def test_serve_refuses_episode_slots_that_cannot_fit(tmp_path, capsys):
    path = tmp_path / "serve.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "env": {"name": "examples.serving_envs:DroneSwarm"},
                "vectorize": "external",
                "num_envs": 10_000_000,
                "policies": {"pilot": {}},
            }
        )
    )
    assert main(["serve", str(path), "--port", "0"]) == 2
    assert "num_envs 10,000,000" in capsys.readouterr().err
