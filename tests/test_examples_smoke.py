"""Examples run end to end with tiny counts, started as a user would: one command from the
repository root (what they show is checked in tests/test_examples_copyable.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl_runner import cli, restore_checkpoint
from marl_runner.metrics_log import read_progress_csv

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a training run in a fresh interpreter: 5-8 s
@pytest.mark.timeout(120)
def test_train_ppo_smoke_writes_progress_plot_and_checkpoints(tmp_path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "examples/train_ppo.py", "--smoke", "--tensorboard"]
        + ["--run-dir", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SPS" in result.stdout

    rows = read_progress_csv(run_dir / "progress.csv")
    assert [row["iteration"] for row in rows] == [1.0, 2.0, 3.0]
    assert all(later["env_steps"] > earlier["env_steps"] for earlier, later in zip(rows, rows[1:]))
    for row in rows:
        for key in ("sps", "shared/policy_loss", "shared/value_loss", "shared/entropy"):
            assert math.isfinite(row[key]), (key, row)
        assert row["shared/entropy"] > 0
    assert (run_dir / "learning_curve.png").read_bytes().startswith(PNG_SIGNATURE)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("shared/value_loss")]
    assert logged == [
        (int(row["env_steps"]), pytest.approx(row["shared/value_loss"])) for row in rows
    ]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == rows[-1]["env_steps"]
    for key in ("random_episode_reward_mean", "trained_episode_reward_mean"):
        assert math.isfinite(summary[key])
    for kind in ("random", "trained"):  # one shared policy: it earns the whole episode's reward
        per_policy = summary[f"{kind}_policy_reward_mean"]
        assert per_policy == {"shared": pytest.approx(summary[f"{kind}_episode_reward_mean"])}

    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["final.ckpt", "iter_00001.ckpt", "iter_00002.ckpt", "iter_00003.ckpt"]
    with restore_checkpoint(run_dir / "checkpoints" / "final.ckpt") as runner:
        assert "advantages" in runner.sample().policy_batches["shared"]


# Each example's one command from its docstring, with small counts, and a line it must print.
EXAMPLE_COMMANDS = {
    "custom_connector": (
        ["examples/custom_connector.py", "--steps", "40"],
        "last column == min(t / 25, 1) on every row: True",
    ),
    "custom_mapping": (["examples/custom_mapping.py", "--episodes", "8"], "player_2 (second)"),
    "custom_env": (
        ["examples/custom_env.py", "--episodes", "2", "--max-steps", "30"],
        "rewards conserved for all",
    ),
    "custom_metrics": (
        ["examples/custom_metrics.py", "--episodes", "2", "--max-cycles", "40"],
        "custom_metrics['archer_kills']",
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name",
    # One in the default suite; each takes 3-4 s in a fresh interpreter, all in test-all.
    [name if name == "custom_env" else pytest.param(name, marks=pytest.mark.slow)
     for name in sorted(EXAMPLE_COMMANDS)],
)
def test_example_runs_in_one_command(name: str) -> None:
    argv, expected = EXAMPLE_COMMANDS[name]
    result = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=50
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert expected in result.stdout, result.stdout


@pytest.mark.parametrize(
    "config", ["hive", "kaz_custom_metrics", "simple_spread_time_feature", "tictactoe_vs_random"]
)
def test_example_configs_validate_from_the_cli(config: str, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)  # as their comments say: run from the repository root
    assert cli.main(["validate", f"examples/configs/{config}.yaml"]) == 0
    assert "config OK" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_train_ppo_trains_a_cnn_on_pistonball_frames_in_smoke_mode(tmp_path) -> None:
    run_dir = tmp_path / "pistonball"
    result = subprocess.run(
        [sys.executable, "examples/train_ppo.py", "--env", "pistonball", "--smoke"]
        + ["--run-dir", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_progress_csv(run_dir / "progress.csv")
    assert rows and all(math.isfinite(row["shared/value_loss"]) for row in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert math.isfinite(summary["random_episode_reward_mean"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_train_ppo_imports_examples_configs_when_run_from_another_folder(tmp_path) -> None:
    # connect_four.yaml names "examples.mappings:by_seat": importable from the repository root,
    # which the script puts on sys.path itself, not from the folder it is started in.
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_ppo.py"), "--env", "connect_four"]
        + ["--smoke", "--run-dir", str(run_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["trained_policy_reward_mean"]) == {"player_0", "player_1"}
