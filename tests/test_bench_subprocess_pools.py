"""The process-backend benchmarks run (a smoke test: the numbers mean nothing here)."""

from __future__ import annotations

import pytest

from marl_runner.bench.subprocess_pools import slow_sub_env, vector_speedup

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def test_slow_sub_env_reports_every_mode():
    rows = slow_sub_env(num_envs=3, num_envs_per_poll=2, duration_s=0.2, warmup_s=0.0)
    assert [(r["num_envs_per_poll"], r["slow_sub_env"]) for r in rows] == [
        (3, False), (3, True), (2, False), (2, True),
    ]
    assert rows[0]["others_kept"] == 1.0
    assert all(r["others_env_steps_per_s"] > 0 for r in rows)


def test_vector_speedup_reports_both_ratios_from_windows_taking_turns():
    said = []
    (row,) = vector_speedup(
        ("spread",),
        duration_s=0.0,
        warmup_s=0.0,
        repeats=2,
        rollout_fragment_length=5,
        progress=said.append,
    )
    assert row["name"] == "spread" and row["bare_speedup"] > 0 and row["runner_speedup"] > 0
    assert row["runner_subprocess_over_bare_sync"] > 0
    for key in ("bare_subprocess", "runner_subprocess"):
        breakdown = row["per_round_ms"][key]
        assert breakdown["worker_busy"] >= breakdown["worker_env"] > 0
        assert breakdown["main_wait"] >= 0 and breakdown["main_ipc"] > 0
        assert 0 <= breakdown["pickled_share"] <= 1
    windows = [line.split(": ")[1] for line in said if "window" in line]
    first = ["bare_sync", "bare_subprocess", "runner_sync", "runner_subprocess"]
    assert windows == [f"{key} window 1" for key in first] + [
        f"{key} window 2" for key in reversed(first)
    ]
