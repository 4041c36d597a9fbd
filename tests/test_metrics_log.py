"""Run logs: JSON-lines metrics records from a real runner, read back, and plotted."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from marl_runner import EnvRunner
from marl_runner.metrics_log import (
    MetricsLogWriter,
    RunMetrics,
    plot_learning_curve,
    read_metrics_log,
    read_progress_csv,
)
from tests.runner_helpers import config

CHEAP = "marl_runner.bench.envs:CheapEnv"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_records_from_a_runner_count_every_step(tmp_path) -> None:
    path = tmp_path / "logs" / "metrics.jsonl"
    env_steps = []
    with EnvRunner(config(CHEAP, env_config={"num_agents": 3, "episode_len": 7})) as runner:
        with MetricsLogWriter(path, interval_s=0) as log:
            for _ in range(3):
                env_steps.append(runner.sample().env_steps())
                assert log.maybe_write(runner.get_metrics, iteration=len(env_steps))
    records = read_metrics_log(path)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert [r["num_env_steps"] for r in records] == env_steps
    assert [r["env_steps"] for r in records] == np.cumsum(env_steps).tolist()
    assert all(r["episodes"] > 0 and math.isfinite(r["episode_reward_mean"]) for r in records)
    assert records[0]["elapsed_s"] <= records[1]["elapsed_s"] <= records[2]["elapsed_s"]


def test_maybe_write_waits_for_the_interval_without_reading_metrics(tmp_path) -> None:
    calls = []

    def get_metrics() -> dict:
        calls.append(1)
        return {"num_env_steps": 5}

    with MetricsLogWriter(tmp_path / "m.jsonl", interval_s=3600) as log:
        assert not log.maybe_write(get_metrics)
        log.write(get_metrics())
    assert len(calls) == 1 and len(read_metrics_log(tmp_path / "m.jsonl")) == 1


def test_non_finite_and_numpy_values_are_valid_json(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    with MetricsLogWriter(path) as log:
        record = log.write(
            {"episode_reward_mean": float("nan"), "n": np.int64(3), "per": {1: np.float32(0.5)}},
            rewards=np.array([1.0, np.inf]),
        )
    line = path.read_text().strip()
    assert json.loads(line) == record
    assert record["episode_reward_mean"] is None and record["n"] == 3
    assert record["per"] == {"1": 0.5} and record["rewards"] == [1.0, None]
    with pytest.raises(ValueError, match="closed"):
        log.write({})


def test_a_torn_last_line_is_skipped_but_a_torn_middle_line_is_an_error(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_metrics_log(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2"):
        read_metrics_log(path)


def test_plot_from_progress_csv_skips_missing_values(tmp_path) -> None:
    csv_path = tmp_path / "progress.csv"
    csv_path.write_text("env_steps,episode_reward_mean\n10,\n20,-5.5\n30,-4.0\n")
    rows = read_progress_csv(csv_path)
    assert math.isnan(rows[0]["episode_reward_mean"]) and rows[2]["env_steps"] == 30.0
    png = plot_learning_curve(rows, tmp_path / "img" / "curve.png", baselines={"random": -6.0})
    assert png.read_bytes().startswith(PNG_SIGNATURE) and png.stat().st_size > 1000


def test_plot_without_any_finite_value_names_the_columns(tmp_path) -> None:
    rows = [{"env_steps": 1, "episode_reward_mean": None}]
    with pytest.raises(ValueError, match="episode_reward_mean"):
        plot_learning_curve(rows, tmp_path / "curve.png")
    assert not (tmp_path / "curve.png").exists()


class InterruptedOnce(MetricsLogWriter):
    """A log whose second write is hit by Ctrl-C after the metrics were read."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def write(self, metrics, **fields):
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        return super().write(metrics, **fields)


def sample_polled(runner: EnvRunner, run: RunMetrics, samples: int) -> list[int]:
    """Env steps of each sample, with a poll after each as the CLI does."""
    steps = []
    for _ in range(samples):
        steps.append(runner.sample().env_steps())
        run.poll()
    return steps


def test_run_metrics_log_intervals_and_sum_them_up(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    with EnvRunner(config(CHEAP, env_config={"num_agents": 3, "episode_len": 7})) as runner:
        with MetricsLogWriter(path, interval_s=0) as log:
            run = RunMetrics(runner.get_metrics, log)
            steps = sample_polled(runner, run, 3)
            summary = run.finish()  # nothing since the last poll: no empty last record
    records = read_metrics_log(path)
    assert [r["num_env_steps"] for r in records] == steps
    assert summary["num_env_steps"] == sum(steps) == records[-1]["env_steps"]
    assert summary["episodes"] == sum(r["episodes"] for r in records)
    weighted = sum(r["episode_reward_mean"] * r["episodes"] for r in records) / summary["episodes"]
    assert summary["episode_reward_mean"] == pytest.approx(weighted)
    assert summary["episode_reward_min"] == min(r["episode_reward_min"] for r in records)


def test_run_metrics_a_record_lost_to_ctrl_c_joins_the_last_one(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    with EnvRunner(config(CHEAP, env_config={"num_agents": 2, "episode_len": 5})) as runner:
        with InterruptedOnce(path, interval_s=0) as log:
            run = RunMetrics(runner.get_metrics, log)
            first = sample_polled(runner, run, 1)
            with pytest.raises(KeyboardInterrupt):
                sample_polled(runner, run, 1)
            last = runner.sample().env_steps()
            run.finish()
    records = read_metrics_log(path)
    assert [r["num_env_steps"] for r in records] == [first[0], 2 * last]
    assert records[-1]["env_steps"] == first[0] + 2 * last


def test_run_metrics_of_a_group_keep_its_state_keys(tmp_path) -> None:
    from marl_runner.distributed import EnvRunnerGroup

    with EnvRunnerGroup(config(CHEAP, env_config={"num_agents": 2, "episode_len": 5})) as group:
        run = RunMetrics(group.get_metrics, MetricsLogWriter(tmp_path / "m.jsonl", interval_s=0))
        for _ in group.iter_batches(3):
            run.poll()
        summary = run.finish()
        run.log.close()
    assert summary["num_healthy_runners"] == 1 and summary["num_runner_restarts"] == 0
    assert summary["num_env_steps"] == group.totals.env_steps


def test_run_metrics_without_a_log_read_the_source_once() -> None:
    with EnvRunner(config(CHEAP, env_config={"num_agents": 2, "episode_len": 5})) as runner:
        run = RunMetrics(runner.get_metrics)
        steps = sample_polled(runner, run, 2)
        summary = run.finish()
        assert summary["num_env_steps"] == sum(steps)
        assert runner.get_metrics()["num_env_steps"] == 0


def test_run_metrics_fold_intervals_as_they_come_and_merge_them_as_all_at_once(tmp_path) -> None:
    """A long run (a server logging every minute for months) holds one summary, not every
    interval, and that summary is what merging all the intervals at once gives."""
    import tracemalloc

    from marl_runner.metrics_merge import merge_metrics

    rng = np.random.default_rng(0)

    def interval(i: int) -> dict:
        episodes = int(rng.integers(0, 4))
        return {
            "num_env_steps": int(rng.integers(0, 100)),
            "num_agent_steps": int(rng.integers(0, 300)),
            "episodes": episodes,
            "episode_reward_mean": float(rng.normal()) if episodes else float("nan"),
            "episode_reward_min": float(rng.normal()) if episodes else float("nan"),
            "policy_reward_mean": {"p0": float(rng.normal())} if episodes else {},
            "perf": {"mean_env_wait_ms": float(rng.uniform(1, 2)), "mean_inference_ms": float("nan") if i % 3 else 0.5},
            "faults": [f"fault {i}"] if i % 7 == 0 else [],
            "num_healthy_runners": i,
        }

    parts = [interval(i) for i in range(50)]
    source = iter(parts)
    run = RunMetrics(lambda: next(source))
    for _ in parts:
        run._read()
    folded = run.summary()
    whole = RunMetrics._merge(parts, run._start)
    assert folded.keys() == whole.keys()
    for key, value in whole.items():
        if key.endswith("_per_s"):
            continue  # rates over wall time read a moment apart
        if isinstance(value, dict):
            assert folded[key] == pytest.approx(value), key
        elif isinstance(value, float):
            assert folded[key] == pytest.approx(value, nan_ok=True), key
        else:
            assert folded[key] == value, key
    assert folded["faults"] == [f"fault {i}" for i in range(0, 50, 7)][-10:]
    assert folded["num_healthy_runners"] == 49
    assert merge_metrics(parts, 1.0)["num_env_steps"] == folded["num_env_steps"]

    endless = RunMetrics(lambda: interval(1), MetricsLogWriter(tmp_path / "m.jsonl", interval_s=0))
    for _ in range(200):
        assert endless.poll()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(2000):
        endless.poll()
    grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    endless.log.close()
    assert grown < 50_000, f"2,000 more intervals grew the summary's memory by {grown} bytes"
