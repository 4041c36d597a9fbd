"""``--population``: many agents per env (battle, the 512-agent cheap env).

Per workload and vector env (sync, subprocess): agent steps/s and µs per agent
step of the runner and of the bare loop (numpy forward, the comparison the
ratio is taken against, and torch), windows alternating; then, in a fresh
process each, the peak RSS while sampling beyond the runner's build, divided
by the bytes of the batch handed out (the trainer drops each batch before the
next ``sample()``), and the bytes per row. The bare loop's own peak beyond its
build over as many rounds (the env's memory, the allocators') is measured the
same way, so that the runner's own share can be told apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from time import perf_counter
from typing import Any

from marl_runner.batch import MultiAgentBatch
from marl_runner.bench.bare_loop import BareLoop
from marl_runner.bench.measure import Settings, _median, time_runner
from marl_runner.bench.workloads import get_workload
from marl_runner.sampling.runner import EnvRunner

Progress = Callable[[str], None]
VECTORIZE = ("sync", "subprocess")
#: Batches sampled in the memory child (the peak settles after the second).
MEMORY_BATCHES = 4


def batch_bytes(batch: MultiAgentBatch) -> tuple[int, int]:
    """(bytes of every column, rows) over the batch's policies."""
    total = rows = 0
    for policy_batch in batch.policy_batches.values():
        rows += len(policy_batch)
        total += sum(column.nbytes for column in policy_batch.values())
    return total, rows


def population_workload(
    name: str, settings: Settings, vectorize: str, *, num_workers: int = 2, progress: Progress
) -> dict[str, Any]:
    """Runner vs bare loops (numpy and torch forward) on one workload and vector env."""
    workload = get_workload(name)
    config = settings.config(workload, vectorize, num_workers if vectorize == "subprocess" else None)
    runner = EnvRunner(config)
    bares = {forward: BareLoop(config, forward) for forward in ("numpy", "torch")}
    rates: dict[str, list[float]] = {"runner": [], "numpy": [], "torch": []}
    try:
        progress(f"population {name} {vectorize}: warm-up")
        time_runner(runner, settings.warmup_s)
        for bare in bares.values():
            bare.run(duration_s=settings.warmup_s, min_rounds=settings.min_bare_rounds)
        for repeat in range(settings.repeats):
            progress(f"population {name} {vectorize}: repeat {repeat + 1}/{settings.repeats}")
            rates["runner"].append(time_runner(runner, settings.duration_s).agent_steps_per_s)
            for forward, bare in bares.items():
                window = bare.run(duration_s=settings.duration_s, min_rounds=settings.min_bare_rounds)
                rates[forward].append(window.agent_steps / max(window.elapsed_s, 1e-9))
    finally:
        runner.stop()
        for bare in bares.values():
            bare.stop()
    medians = {side: _median(values) for side, values in rates.items()}
    return {
        "name": name,
        "vectorize": vectorize,
        "num_envs": config.num_envs,
        "agent_steps_per_s": medians,
        "us_per_agent_step": {side: 1e6 / rate for side, rate in medians.items() if rate > 0},
        "ratio_numpy": medians["runner"] / medians["numpy"],
        "ratio_torch": medians["runner"] / medians["torch"],
        "target_ratio": workload.target_ratio,
        "memory": memory_per_batch(name, settings, vectorize, num_workers),
    }


def memory_per_batch(name: str, settings: Settings, vectorize: str, num_workers: int) -> dict[str, Any]:
    """Peak RSS beyond the build per batch, measured in a fresh process (``_memory_child``)."""
    args = {"name": name, "vectorize": vectorize, "num_workers": num_workers, "seed": settings.seed,
            "rollout_fragment_length": settings.rollout_fragment_length,
            "batches": 2 if settings.smoke else MEMORY_BATCHES}
    runner = _run_memory_child("_memory_child", args)
    bare = _run_memory_child("_bare_memory_child", {**args, "rounds": runner["rounds"]})
    own_mb = runner["peak_rss_mb"] - runner["built_rss_mb"] - bare["peak_beyond_build_mb"]
    return {
        **runner,
        "bare_peak_beyond_build_mb": bare["peak_beyond_build_mb"],
        "own_peak_per_batch": own_mb / max(runner["batch_mb"], 1e-9),
    }


def _run_memory_child(function: str, args: dict[str, Any]) -> dict[str, Any]:
    """``function(args)`` in a fresh Python process; the JSON line it prints."""
    args_json = json.dumps(args)
    done = subprocess.run(
        [sys.executable, "-c", f"from marl_runner.bench.population import {function}; {function}({args_json!r})"],
        capture_output=True, text=True, check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _vm_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _child_config(args: dict[str, Any]) -> Any:
    return get_workload(args["name"]).config(
        vectorize=args["vectorize"],
        num_workers=args["num_workers"] if args["vectorize"] == "subprocess" else None,
        seed=args["seed"], rollout_fragment_length=args["rollout_fragment_length"],
    )


def _reset_peak() -> int:
    """This process's RSS now (KiB), made its high-water mark."""
    built_kib = _vm_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    return built_kib


def _memory_child(args_json: str) -> None:
    """Builds the runner, resets the RSS high-water mark, samples (dropping each batch as a
    trainer does) and prints the peak beyond the build over the batch's bytes as JSON."""
    args = json.loads(args_json)
    runner = EnvRunner(_child_config(args))
    try:
        built_kib = _reset_peak()
        sizes = []
        started = perf_counter()
        for _ in range(args["batches"]):
            batch = runner.sample()
            sizes.append(batch_bytes(batch))
            del batch
        peak_kib = _vm_kib("VmHWM")
        rounds = runner.get_metrics()["num_env_steps"] // runner.config.num_envs
    finally:
        runner.stop()
    batch_total, rows = max(sizes)
    print(json.dumps({
        "built_rss_mb": built_kib / 1024,
        "peak_rss_mb": peak_kib / 1024,
        "batch_mb": batch_total / 2**20,
        "peak_beyond_build_per_batch": (peak_kib - built_kib) * 1024 / max(batch_total, 1),
        "bytes_per_row": batch_total / max(rows, 1),
        "rows_per_batch": rows,
        "rounds": rounds,
        "seconds": perf_counter() - started,
    }))


def _bare_memory_child(args_json: str) -> None:
    """The bare loop's peak RSS beyond its build over ``rounds`` rounds, as JSON."""
    args = json.loads(args_json)
    bare = BareLoop(_child_config(args), "numpy")
    try:
        built_kib = _reset_peak()
        bare.run(min_rounds=args["rounds"])
        peak_kib = _vm_kib("VmHWM")
    finally:
        bare.stop()
    print(json.dumps({"peak_beyond_build_mb": (peak_kib - built_kib) / 1024}))


def measure_population(
    names: tuple[str, ...], settings: Settings, *, num_workers: int, progress: Progress
) -> list[dict[str, Any]]:
    """Every named population workload under every vector env."""
    return [
        population_workload(name, settings, vectorize, num_workers=num_workers, progress=progress)
        for name in names
        for vectorize in VECTORIZE
    ]
