"""MetricsCollector: exact episode summaries, at constant memory however long nobody reads them.

`marl-runner serve` without a metrics log reads the runner's metrics once, at
the end; before, every finished episode's record was kept until then (about
1.4 KB each: a server's RSS grew by ~2 MB a minute under load).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from marl_runner.metrics import MetricsCollector, RolloutMetrics


def _record(length: int, agent_rewards: dict, custom: dict, faulty: bool = False) -> RolloutMetrics:
    return RolloutMetrics(
        length, float(sum(agent_rewards.values())), agent_rewards, custom,
        {"mean_inference_ms": 0.5}, {}, {}, {}, faulty,
    )


def test_summary_means_min_max_per_policy_and_custom_metrics() -> None:
    collector = MetricsCollector()
    records = [
        _record(10, {("a0", "red"): 1.5, ("a1", "blue"): -0.5}, {"hits": 3.0}),
        _record(4, {("a0", "red"): 2.0}, {}),
        _record(7, {("a1", "blue"): 4.0, ("a2", "blue"): 1.0}, {"hits": 1.0}),
        _record(99, {}, {"hits": 100.0}, faulty=True),
    ]
    for record in records:
        collector.add_episode(record, num_late_rewards=2)
    collector.num_env_steps = 21
    summary = collector.summary(perf={"x": 1.0}, connector_metrics={})

    good = records[:3]
    rewards = [r.episode_reward for r in good]
    assert summary["episodes"] == 3 and summary["num_faulty_episodes"] == 1
    assert summary["num_late_rewards"] == 8
    assert summary["episode_reward_mean"] == pytest.approx(np.mean(rewards))
    assert summary["episode_reward_min"] == min(rewards)
    assert summary["episode_reward_max"] == max(rewards)
    assert summary["episode_len_mean"] == pytest.approx(7.0)
    # A policy's mean is over the episodes it took part in, its agents' rewards summed.
    assert summary["policy_reward_mean"] == pytest.approx({"red": 1.75, "blue": 2.25})
    assert summary["custom_metrics"] == pytest.approx({"hits": 2.0})
    assert summary["num_env_steps"] == 21

    empty = collector.summary(perf={}, connector_metrics={})  # the counters were reset
    assert empty["episodes"] == 0 and empty["num_faulty_episodes"] == 0
    assert all(math.isnan(empty[key]) for key in (
        "episode_reward_mean", "episode_reward_min", "episode_reward_max", "episode_len_mean"))
    assert empty["policy_reward_mean"] == {} and empty["custom_metrics"] == {}


def test_records_are_added_up_not_kept() -> None:
    collector = MetricsCollector()
    collector.add_episode(_record(5, {("a0", "red"): 1.0}, {"hits": 1.0}))  # names seen once
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            collector.add_episode(
                _record(5, {("a0", "red"): float(i), ("a1", "red"): 1.0}, {"hits": 2.0})
            )
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept for 20,000 episode records"
    summary = collector.summary(perf={}, connector_metrics={})
    assert summary["episodes"] == 20_001
    assert summary["policy_reward_mean"]["red"] == pytest.approx(
        (1.0 + sum(i + 1.0 for i in range(20_000))) / 20_001, rel=1e-12
    )
