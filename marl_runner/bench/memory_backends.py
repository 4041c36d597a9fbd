"""``bench --memory``: RSS growth over many agent steps, on each vector env backend.

Each backend samples the cheap workload from ``start_steps`` to ``end_steps``
agent steps. RSS is read (after ``gc.collect()``, no batch alive) for the
main process and for every process that runs sub-envs: ``subprocess``'s env
workers, and under ``ray`` each sub-env actor's worker process. Each process
is judged on its own, so a leak in one worker is not hidden in a sum.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from time import perf_counter
from typing import Any

import psutil

from marl_runner.bench.measure import Settings
from marl_runner.bench.workloads import MEMORY_WORKLOAD, get_workload
from marl_runner.distributed.ray_session import ray_session
from marl_runner.sampling.runner import EnvRunner

Progress = Callable[[str], None]
#: Every backend ``--memory`` knows, in the order it measures them.
MEMORY_BACKENDS = ("sync", "subprocess", "ray")
#: The issue's bar: RSS grows less than this between the two readings, in every process.
LIMIT_PCT = 5.0
#: Sub-envs under ``ray``: each is an actor with a Python process of its own, so the
#: workload's 64 would be 64 processes on a 2-core machine.
RAY_NUM_ENVS = 8
RAY_MISSING = "Ray is not installed; the ray backend needs the extra: pip install 'marl-runner[ray]'"


def _quiet(_: str) -> None:
    pass


def parse_backends(text: str) -> tuple[str, ...]:
    """``"sync,ray"`` -> ``("sync", "ray")`` in measuring order; any other name is an error."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in MEMORY_BACKENDS]
    if not names or unknown:
        raise ValueError(
            f"memory backends {text!r}: expected a comma-separated list of "
            f"{', '.join(MEMORY_BACKENDS)}"
        )
    return tuple(name for name in MEMORY_BACKENDS if name in names)


def ray_missing() -> str | None:
    """Why the ray backend cannot run here, or None when it can."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return RAY_MISSING
    return None


@dataclasses.dataclass(frozen=True)
class Watched:
    """A process whose RSS is followed, and what it does for the backend."""

    role: str
    process: psutil.Process

    def rss_mb(self) -> float:
        """The process's resident memory now, in MiB: what the growth check compares."""
        return self.process.memory_info().rss / 2**20


def _ray_actor_pids(runner: EnvRunner) -> list[int]:
    """Each sub-env actor's process id, by env id (asked of the actors themselves)."""
    import ray

    return ray.get([a.__ray_call__.remote(lambda _actor: os.getpid()) for a in runner.env.actors])


def watched_processes(runner: EnvRunner) -> list[Watched]:
    """The main process and those running the runner's sub-envs."""
    main = [Watched("main", psutil.Process())]
    vectorize = runner.config.vectorize
    if vectorize == "subprocess":
        workers = [psutil.Process(pid) for pid in runner.env.worker_pids]
        return main + [Watched(f"env worker {i}", p) for i, p in enumerate(workers)]
    if vectorize == "ray":
        pids = _ray_actor_pids(runner)
        return main + [Watched(f"sub-env actor {i}", psutil.Process(p)) for i, p in enumerate(pids)]
    return main


def _readings(watched: list[Watched]) -> list[float]:
    gc.collect()
    return [w.rss_mb() for w in watched]


def _growth_pct(start: float, end: float) -> float:
    return (end - start) / start * 100.0


def sample_and_watch(
    runner: EnvRunner,
    watched: list[Watched],
    *,
    start_steps: int,
    end_steps: int,
    every_steps: int,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Samples until ``end_steps`` agent steps; RSS of every watched process at
    ``start_steps``, every ``every_steps`` and at the end."""
    series: list[dict[str, Any]] = []
    start: list[float] | None = None
    start_at, steps, next_mark = 0, 0, every_steps
    while steps < end_steps:
        batch = runner.sample()
        steps += batch.agent_steps()
        del batch
        runner.get_metrics()  # as a training loop would; the runner keeps episode records until then
        if start is None and steps >= start_steps:
            start, start_at = _readings(watched), steps
            progress(f"memory {runner.config.vectorize}: {steps:,} agent steps, start")
        if steps >= next_mark:
            series.append({"agent_steps": steps, "rss_mb": _readings(watched)})
            while next_mark <= steps:
                next_mark += every_steps
    end = _readings(watched)
    progress(f"memory {runner.config.vectorize}: {steps:,} agent steps, end")
    assert start is not None  # start_steps < end_steps <= steps
    processes = [
        {
            "role": w.role,
            "pid": w.process.pid,
            "start_rss_mb": s,
            "end_rss_mb": e,
            "growth_pct": _growth_pct(s, e),
            "ok": bool(_growth_pct(s, e) < LIMIT_PCT),
        }
        for w, s, e in zip(watched, start, end, strict=True)
    ]
    total_start, total_end = sum(start), sum(end)
    return {
        "start_agent_steps": start_at,
        "end_agent_steps": steps,
        "processes": processes,
        "start_rss_mb": total_start,
        "end_rss_mb": total_end,
        "growth_pct": _growth_pct(total_start, total_end),
        "limit_pct": LIMIT_PCT,
        "ok": all(p["ok"] for p in processes),
        "series": series,
    }


def measure_backend(
    backend: str,
    settings: Settings,
    *,
    start_steps: int,
    end_steps: int,
    every_steps: int,
    num_workers: int = 2,
    ray_num_envs: int = RAY_NUM_ENVS,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """RSS growth of one backend on the cheap workload; ``skipped`` says why when it cannot run."""
    if backend not in MEMORY_BACKENDS:
        raise ValueError(f"memory backend {backend!r}: expected one of {MEMORY_BACKENDS}")
    workload = get_workload(MEMORY_WORKLOAD)
    if backend == "ray":
        missing = ray_missing()
        if missing is not None:
            return {"backend": backend, "skipped": missing}
        workload = dataclasses.replace(workload, num_envs=ray_num_envs)
    config = settings.config(workload, backend, num_workers)
    clock = perf_counter()
    # Ray: a local Ray with 2 CPUs, shut down after; one already connected is used and left running.
    with ray_session(num_cpus=2) if backend == "ray" else nullcontext():
        runner = EnvRunner(config)
        try:
            watched = watched_processes(runner)
            result = sample_and_watch(
                runner, watched, start_steps=start_steps, end_steps=end_steps,
                every_steps=every_steps, progress=progress,
            )
        finally:
            runner.stop()
    return {
        "backend": backend,
        "num_envs": config.num_envs,
        "num_workers": config.num_workers if backend == "subprocess" else None,
        **result,
        "elapsed_s": perf_counter() - clock,
    }


def memory_growth(
    settings: Settings,
    *,
    backends: Sequence[str] = MEMORY_BACKENDS,
    start_steps: int = 200_000,
    end_steps: int = 1_000_000,
    every_steps: int = 100_000,
    num_workers: int = 2,
    ray_num_envs: int = RAY_NUM_ENVS,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """RSS growth between ``start_steps`` and ``end_steps`` agent steps on each backend."""
    return {
        "workload": MEMORY_WORKLOAD,
        "limit_pct": LIMIT_PCT,
        "backends": [
            measure_backend(
                backend, settings, start_steps=start_steps, end_steps=end_steps,
                every_steps=every_steps, num_workers=num_workers, ray_num_envs=ray_num_envs,
                progress=progress,
            )
            for backend in backends
        ],
    }
