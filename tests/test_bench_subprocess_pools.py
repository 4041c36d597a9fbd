"""The process-backend benchmarks run (a smoke test: the numbers mean nothing here)."""

from __future__ import annotations

import pytest

from benchmarks.subprocess_pools import slow_sub_env, vector_speedup

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


def test_vector_speedup_reports_both_ratios():
    (row,) = vector_speedup(
        ("spread",), duration_s=0.0, warmup_s=0.0, repeats=1, rollout_fragment_length=5
    )
    assert row["name"] == "spread" and row["bare_speedup"] > 0 and row["runner_speedup"] > 0
