"""Examples run end to end in their --smoke mode, as a user would start them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from marl_runner import restore_checkpoint
from marl_runner.metrics_log import read_progress_csv

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_train_ppo_smoke_writes_progress_plot_and_checkpoints(tmp_path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "examples/train_ppo.py", "--smoke", "--run-dir", str(run_dir)],
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

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == rows[-1]["env_steps"]
    for key in ("random_episode_reward_mean", "trained_episode_reward_mean"):
        assert math.isfinite(summary[key])

    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["final.ckpt", "iter_00001.ckpt", "iter_00002.ckpt", "iter_00003.ckpt"]
    with restore_checkpoint(run_dir / "checkpoints" / "final.ckpt") as runner:
        assert "advantages" in runner.sample().policy_batches["shared"]
