"""`marl-runner evaluate CHECKPOINT`: whole episodes with a checkpoint's policies, summarised."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers_runner_connectors import (
    FILTER,
    filter_of,
    one_torch_thread,  # noqa: F401 (a fixture)
)
from PIL import Image

import marl_runner.checkpoint
import marl_runner.cli.evaluate
from examples import train_ppo
from marl_runner import EnvRunner, RunnerConfig, save_checkpoint
from marl_runner.checkpoint.evaluation import EvaluationError, evaluate_checkpoint
from marl_runner.cli.common import CommandError
from marl_runner.cli.evaluate import add_evaluate_parser, run_evaluate
from marl_runner.envs import register_env
from tests.envs import CheapEnv

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"


def evaluate_cli(argv: list[str]) -> int:
    """``marl-runner evaluate ARGV``: the parser and error handling of ``marl_runner.cli.main``."""
    parser = argparse.ArgumentParser(prog="marl-runner")
    add_evaluate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["evaluate", *argv])
    try:
        return run_evaluate(args)
    except CommandError as exc:
        print(f"marl-runner evaluate: error: {exc}", file=sys.stderr)
        return exc.exit_code


def saved(path: Path, data: dict[str, Any]) -> Path:
    with EnvRunner(RunnerConfig.from_dict(data)) as runner:
        return save_checkpoint(runner, path)


@pytest.fixture(scope="module")
def ppo_checkpoint(tmp_path_factory) -> Path:
    """examples/train_ppo.py --smoke on simple_spread (3 agents, one shared policy, 25 steps)."""
    run_dir = tmp_path_factory.mktemp("ppo")
    train_ppo.main(["--smoke", "--run-dir", str(run_dir)])
    return run_dir / "checkpoints" / "final.ckpt"


def test_evaluate_a_train_ppo_checkpoint(ppo_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval" / "result.json"
    argv = [str(ppo_checkpoint), "--episodes", "3", "--seed", "5", "--out", str(out)]
    assert evaluate_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "shared" in printed and "all agents" in printed and "mean episode length 25" in printed
    result = json.loads(out.read_text())
    assert result["episodes"] == 3 and result["episode_lengths"] == [25, 25, 25]
    assert result["seed"] == 5 and result["deterministic"] is False
    shared = result["policies"]["shared"]
    assert shared["episodes"] == 3
    assert shared["reward_mean"] == pytest.approx(result["episode_reward_mean"])  # one policy
    assert shared["reward_std"] == pytest.approx(result["episode_reward_std"])
    # The same seed gives the same episodes; greedy actions are another run.
    again = evaluate_checkpoint(ppo_checkpoint, episodes=3, seed=5)
    assert again.summary()["episode_rewards"] == result["episode_rewards"]
    greedy = evaluate_checkpoint(ppo_checkpoint, episodes=3, seed=5, deterministic=True)
    assert greedy.deterministic and greedy.summary()["episode_rewards"] != result["episode_rewards"]


def test_render_writes_the_first_episode_as_a_gif(tmp_path, capsys):
    checkpoint = saved(
        tmp_path / "ttt.ckpt",
        {"env": {"name": TICTACTOE}, "policies": {"shared": {"model": {"hidden": [8]}}}},
    )
    gif = tmp_path / "frames" / "first.gif"
    argv = [str(checkpoint), "--episodes", "2", "--render", str(gif)]
    argv += ["--out", str(tmp_path / "r.json")]
    assert evaluate_cli(argv) == 0
    first_length = json.loads((tmp_path / "r.json").read_text())["episode_lengths"][0]
    with Image.open(gif) as image:
        assert image.n_frames == first_length + 1  # the reset state, then one per step
        assert image.size == (1000, 1000)
    assert f"wrote {first_length + 1} frames to {gif}" in capsys.readouterr().out


def cheap_checkpoint(path: Path, creator_name: str, **changes: Any) -> Path:
    return saved(
        path,
        {
            "env": {"name": creator_name, "config": {"num_agents": 2, "episode_len": 4}},
            "policies": {"shared": {"model": {"hidden": [4]}}},
            **changes,
        },
    )


register_env("evaluate-cheap", lambda cfg: CheapEnv(**cfg))
register_env(
    "evaluate-cheap-no-render",
    lambda cfg: CheapEnv(**{k: v for k, v in cfg.items() if k != "render_mode"}),
)


def test_render_on_an_env_without_rgb_arrays_is_a_clear_error(tmp_path, capsys):
    for name, message in (
        ("evaluate-cheap", "cannot be built with render_mode='rgb_array'"),
        ("evaluate-cheap-no-render", "render() returned NoneType None; expected an rgb_array"),
    ):
        checkpoint = cheap_checkpoint(tmp_path / f"{name}.ckpt", name)
        assert evaluate_cli([str(checkpoint), "--render", str(tmp_path / "x.gif")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "x.gif").exists()


def test_evaluation_does_not_update_observation_filter_statistics(tmp_path, monkeypatch):
    """Evaluating measures the policy as saved: its MeanStd filter normalises with the saved
    statistics and learns nothing from the evaluation episodes."""
    data = {
        "env": {"name": "evaluate-cheap", "config": {"num_agents": 2, "episode_len": 4}},
        "policies": {"shared": {"model": {"hidden": [4]}, "agent_connectors": [FILTER]}},
    }
    with EnvRunner(RunnerConfig.from_dict(data)) as runner:
        runner.sample()  # statistics from training rounds
        saved_stats = filter_of(runner, "shared").get_state()
        checkpoint = save_checkpoint(runner, tmp_path / "filtered.ckpt")
    assert saved_stats["count"] > 0
    restored: list[EnvRunner] = []

    def spy(*args: Any, **kwargs: Any) -> EnvRunner:
        restored.append(real_restore(*args, **kwargs))
        return restored[-1]

    real_restore = marl_runner.checkpoint.restore_checkpoint
    monkeypatch.setattr(marl_runner.checkpoint, "restore_checkpoint", spy)
    result = evaluate_checkpoint(checkpoint, episodes=3)
    assert len(result.episodes) == 3 and [e.length for e in result.episodes] == [4, 4, 4]
    assert filter_of(restored[0], "shared").get_state() == saved_stats


def test_import_paths_from_the_file_need_trusted_or_allow(tmp_path, capsys):
    mapping = "examples.mappings:shared"
    checkpoint = cheap_checkpoint(tmp_path / "m.ckpt", "evaluate-cheap", policy_mapping_fn=mapping)
    assert evaluate_cli([str(checkpoint), "--episodes", "2"]) == 2
    err = capsys.readouterr().err
    assert "config.policy_mapping_fn" in err and "--trusted" in err and mapping in err
    # The CLI names its flags, not the Python arguments (allow=[...], trusted=True).
    assert f"--allow {mapping}" in err and "allow=[" not in err and "trusted=True" not in err
    assert evaluate_cli([str(checkpoint), "--episodes", "2", "--trusted"]) == 0
    assert evaluate_cli([str(checkpoint), "--episodes", "2", "--allow", mapping]) == 0
    capsys.readouterr()
    # --set is the caller's: replacing the path needs no opt-in.
    argv = [str(checkpoint), "--episodes", "2", "--set", "policy_mapping_fn=null"]
    assert evaluate_cli(argv) == 0
    assert "all agents" in capsys.readouterr().out


def test_bad_arguments_and_files(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli([str(tmp_path / "x.ckpt"), "--episodes", "0"])
    assert exit_info.value.code == 2
    assert evaluate_cli([str(tmp_path / "missing.ckpt")]) == 2
    assert "cannot read checkpoint" in capsys.readouterr().err
    checkpoint = cheap_checkpoint(tmp_path / "c.ckpt", "evaluate-cheap")
    assert evaluate_cli([str(checkpoint), "--set", "num_envs=0"]) == 2
    assert "num_envs" in capsys.readouterr().err
    with pytest.raises(EvaluationError, match="fps: got 0"):
        evaluate_checkpoint(checkpoint, episodes=1, fps=0)
    with pytest.raises(EvaluationError, match="vectorize: external"):
        evaluate_checkpoint(checkpoint, episodes=1, overrides=["vectorize=external"])


def test_out_that_is_a_directory_is_refused_before_any_episode(tmp_path, capsys, monkeypatch):
    checkpoint = cheap_checkpoint(tmp_path / "out-dir.ckpt", "evaluate-cheap")
    played = []
    monkeypatch.setattr(
        marl_runner.cli.evaluate, "evaluate_checkpoint", lambda *a, **k: played.append(1)
    )
    assert evaluate_cli([str(checkpoint), "--out", str(tmp_path)]) == 2
    assert "is a directory; expected a file path" in capsys.readouterr().err and not played
