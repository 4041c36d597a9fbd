"""``marl-runner bench --soak MINUTES``: sample for a while with faults injected at random.

Sub-envs (RandomFaultEnv, in worker processes, restarts on) raise in step and
reset, end their worker with ``os._exit`` and hang past a short
``sub_env_step_timeout_s``. Every batch comes in ``complete_episodes`` mode,
so each episode in it must be whole: ``episode_len`` rows per agent and
exactly the rewards the env hands out for a complete episode. The report
says how many episodes, faults and restarts there were, how many healthy
rows were lost (rows missing from returned episodes; must be 0), and RSS,
open files and shared-memory blocks at the start and the end (must stay
flat: no leak per fault).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from marl_runner.checks import check_batch_invariants, rewards_per_trajectory, trajectory_rows
from marl_runner.config import RunnerConfig
from marl_runner.sampling.runner import EnvRunner

EPISODE_LEN = 20
#: A complete RandomFaultEnv episode: a0 gets 0.1 per step, a1 0.2.
EPISODE_REWARDS = {0: 0.1 * EPISODE_LEN, 1: 0.2 * EPISODE_LEN}


def soak_config(
    fault_rate: float = 0.01, num_envs: int = 4, num_workers: int = 2, seed: int = 0
) -> RunnerConfig:
    return RunnerConfig.from_dict(
        {
            "env": {
                "name": "marl_runner.bench.envs.random_fault_env:RandomFaultEnv",
                "config": {"fault_rate": fault_rate, "episode_len": EPISODE_LEN, "hang_s": 30.0},
            },
            "num_envs": num_envs,
            "num_workers": num_workers,
            "vectorize": "subprocess",
            "batch_mode": "complete_episodes",
            "rollout_fragment_length": 100,
            "restart_failed_sub_environments": True,
            "sub_env_step_timeout_s": 0.5,
            "max_consecutive_step_failures": 50,
            "max_consecutive_reset_failures": 50,
            "seed": seed,
            "policies": {"shared": {"model": {"type": "mlp", "hidden": [16]}}},
        }
    )


def _resources() -> dict[str, Any]:
    """RSS of this process and its workers, open files of this process, our shm blocks."""
    me = psutil.Process()
    children = me.children(recursive=True)
    rss = me.memory_info().rss
    for child in children:
        try:
            rss += child.memory_info().rss
        except psutil.Error:
            continue
    shm_prefix = f"mr{os.getpid()}v"
    shm = (
        [n for n in os.listdir("/dev/shm") if n.startswith(shm_prefix)]
        if os.path.isdir("/dev/shm")
        else []
    )
    return {
        "rss_mb": me.memory_info().rss / 2**20,
        "rss_with_workers_mb": rss / 2**20,
        "open_files": me.num_fds() if hasattr(me, "num_fds") else len(me.open_files()),
        "processes": 1 + len(children),
        "shm_blocks": len(shm),
    }


def _check_batch(batch: Any) -> tuple[int, int, int]:
    """`(episodes, rows, rows_lost)` of a complete-episodes batch."""
    check_batch_invariants(batch)
    totals = rewards_per_trajectory(batch)
    lost = 0
    rows = 0
    for policy_batch in batch.policy_batches.values():
        for key, trajectory in trajectory_rows(policy_batch).items():
            rows += len(trajectory)
            lost += max(EPISODE_LEN - len(trajectory), 0)
            if abs(totals[key] - EPISODE_REWARDS[key[1]]) > 1e-4:
                lost += 1  # a reward went missing or was doubled
    return len({eps_id for eps_id, _ in totals}), rows, lost


def run_soak(
    minutes: float,
    *,
    fault_rate: float = 0.01,
    num_envs: int = 4,
    num_workers: int = 2,
    seed: int = 0,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Sample for `minutes` with random faults; the counts and resources as a dict."""
    totals = {
        "episodes_returned": 0,
        "rows_returned": 0,
        "healthy_rows_lost": 0,
        "good_episodes_ended": 0,
        "faulty_episodes": 0,
        "sub_env_restarts": 0,
        "batches": 0,
    }
    config = soak_config(fault_rate, num_envs, num_workers, seed)
    logging.getLogger("marl_runner").setLevel(logging.ERROR)  # one warning per fault otherwise
    started = time.monotonic()
    with EnvRunner(config) as runner:
        runner.sample()  # warm up: workers and torch loaded before the start figures
        runner.get_metrics()
        start = _resources()
        deadline = time.monotonic() + minutes * 60
        last_report = time.monotonic()
        while time.monotonic() < deadline:
            episodes, rows, lost = _check_batch(runner.sample())
            totals["batches"] += 1
            totals["episodes_returned"] += episodes
            totals["rows_returned"] += rows
            totals["healthy_rows_lost"] += lost
            metrics = runner.get_metrics()
            totals["good_episodes_ended"] += metrics["episodes"]
            totals["faulty_episodes"] += metrics["num_faulty_episodes"]
            totals["sub_env_restarts"] += metrics["num_sub_env_restarts"]
            if time.monotonic() - last_report > 30:
                last_report = time.monotonic()
                progress(f"soak: {totals} {_resources()}")
        end = _resources()
    after_stop = _resources()
    return {
        "minutes": minutes,
        "fault_rate_per_step": fault_rate,
        "num_envs": num_envs,
        "num_workers": num_workers,
        **totals,
        "start": start,
        "end": end,
        "after_stop": after_stop,
        "wall_s": time.monotonic() - started,
    }


def print_soak(report: dict[str, Any], write: Callable[[str], None] = print) -> None:
    write(
        f"soak {report['minutes']:g} min: {report['episodes_returned']} episodes returned "
        f"({report['rows_returned']} rows) in {report['batches']} batches; "
        f"{report['faulty_episodes']} faulty episodes, {report['sub_env_restarts']} restarts; "
        f"healthy rows lost: {report['healthy_rows_lost']}"
    )
    for moment in ("start", "end", "after_stop"):
        r = report[moment]
        write(
            f"  {moment:>10}: RSS {r['rss_mb']:.0f} MB (with workers {r['rss_with_workers_mb']:.0f} MB), "
            f"{r['open_files']} open files, {r['processes']} processes, {r['shm_blocks']} shm blocks"
        )
