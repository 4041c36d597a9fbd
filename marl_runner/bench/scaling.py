"""`marl-runner bench --scaling`: agent-steps/s as a run scales out, in one run.

Setups, per workload (KAZ and mpe2 simple_spread): one runner with `sync`,
`subprocess` and `vectorize: ray` sub-envs, then an `EnvRunnerGroup` of 1, 2
and 4 runners (each with sync sub-envs, the workload's `num_envs` split
across the runners, so every setup steps the same number of sub-envs).
Each setup is warmed up (actors started, first samples taken) before it is
timed, and the Ray start-up time (`ray.init` of a local Ray, and building
each group) is reported separately, not mixed into the rates. Not a timed
test: a measurement to read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from marl_runner.bench.workloads import get_workload
from marl_runner.config import RunnerConfig
from marl_runner.sampling.runner import EnvRunner

SCALING_WORKLOADS = ("kaz", "spread")
GROUP_SIZES = (1, 2, 4)


def measure_scaling(
    duration_s: float = 10.0,
    warmup_s: float = 3.0,
    workloads: tuple[str, ...] = SCALING_WORKLOADS,
    progress: Callable[[str], None] = lambda msg: None,
) -> dict[str, Any]:
    """Agent-steps/s of every setup on every workload; Ray start-up times apart."""
    import ray

    from marl_runner.distributed import EnvRunnerGroup
    from marl_runner.distributed.ray_auth import quiet_token_auth_notice

    quiet_token_auth_notice()  # the notice only; token authentication stays on
    start = time.perf_counter()
    ray.init(include_dashboard=False, logging_level=logging.WARNING)
    report: dict[str, Any] = {"ray_init_s": time.perf_counter() - start, "rows": []}
    cpus = ray.cluster_resources().get("CPU", 1.0)
    try:
        for name in workloads:
            workload = get_workload(name)
            base = workload.config(rollout_fragment_length=50)
            for vectorize in ("sync", "subprocess", "ray"):
                progress(f"{name}: one runner, vectorize {vectorize}")
                config = dataclasses.replace(base, vectorize=vectorize)
                built = time.perf_counter()
                with EnvRunner(config) as runner:
                    setup_s = time.perf_counter() - built
                    rate = _agent_steps_per_s(runner.sample, duration_s, warmup_s)
                report["rows"].append(_row(name, f"1 runner, {vectorize}", config, rate, setup_s))
            for size in GROUP_SIZES:
                progress(f"{name}: group of {size} runners")
                config = dataclasses.replace(base, num_envs=max(base.num_envs // size, 1))
                built = time.perf_counter()
                with EnvRunnerGroup(
                    config, num_runners=size, num_cpus_per_runner=min(1.0, cpus / size)
                ) as group:
                    setup_s = time.perf_counter() - built
                    rate = _agent_steps_per_s(group.sample, duration_s, warmup_s)
                label = f"group of {size} ({config.num_envs} sub-envs each)"
                report["rows"].append(_row(name, label, config, rate, setup_s))
    finally:
        ray.shutdown()
    return report


def _agent_steps_per_s(sample: Callable[[], Any], duration_s: float, warmup_s: float) -> float:
    """Agent steps per second of `sample()` calls over `duration_s`, after a warm-up."""
    deadline = time.perf_counter() + warmup_s
    sample()
    while time.perf_counter() < deadline:
        sample()
    steps = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < duration_s or steps == 0:
        steps += sample().agent_steps()
    return steps / elapsed


def _row(workload: str, setup: str, config: RunnerConfig, rate: float, setup_s: float) -> dict:
    return {
        "workload": workload,
        "setup": setup,
        "num_envs": config.num_envs,
        "agent_steps_per_s": rate,
        "setup_s": setup_s,
    }


def print_scaling(report: dict[str, Any], console: Console) -> None:
    table = Table(title="scaling out (agent steps/s; setup = build time, not in the rate)")
    for column in ("workload", "setup", "agent steps/s", "vs sync", "setup s"):
        table.add_column(column, justify="left" if column in ("workload", "setup") else "right")
    sync_rates = {
        row["workload"]: row["agent_steps_per_s"]
        for row in report["rows"]
        if row["setup"] == "1 runner, sync"
    }
    for row in report["rows"]:
        ratio = row["agent_steps_per_s"] / sync_rates[row["workload"]]
        table.add_row(
            row["workload"],
            row["setup"],
            f"{row['agent_steps_per_s']:,.0f}",
            f"{ratio:.2f}x",
            f"{row['setup_s']:.1f}",
        )
    console.print(table)
    console.print(f"Ray start-up (ray.init of a local Ray): {report['ray_init_s']:.1f} s")
