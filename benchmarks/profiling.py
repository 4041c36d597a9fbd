"""cProfile of the runner on a workload: where its time goes, function by function.

cProfile slows Python-heavy code (the runner's bookkeeping) more than C code
(torch, numpy), so read the ranking, not the absolute times.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from pathlib import Path
from typing import Any

from benchmarks.measure import Progress, Settings, _quiet, time_runner
from benchmarks.workloads import Workload
from marl_runner.runner import EnvRunner

_PREFIXES = sorted(
    {p for p in (os.getcwd(), *sys.path) if p and os.path.isdir(p)}, key=len, reverse=True
)


def _short(filename: str) -> str:
    """Paths relative to the repo or site-packages, so the table stays readable."""
    for prefix in _PREFIXES:
        if filename.startswith(prefix + os.sep):
            return filename[len(prefix) + 1:]
    return filename


def profile_workload(
    workload: Workload,
    settings: Settings,
    *,
    top: int = 15,
    out_dir: Path | None = None,
    vectorize: str = "sync",
    num_workers: int | None = None,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Warm up, then profile one timed window of ``runner.sample()`` calls.

    Returns the ``top`` functions by own time (tottime); with ``out_dir``
    the full profile is saved as ``<workload>.prof`` (``python -m pstats``,
    snakeviz).
    """
    config = workload.config(
        vectorize=vectorize, num_workers=num_workers, seed=settings.seed,
        rollout_fragment_length=settings.rollout_fragment_length,
    )
    runner = EnvRunner(config)
    profiler = cProfile.Profile()
    try:
        progress(f"{workload.name}: profiling")
        time_runner(runner, settings.warmup_s)
        profiler.enable()
        window = time_runner(runner, settings.duration_s)
        profiler.disable()
    finally:
        runner.stop()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values()) or 1e-9  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)  # type: ignore[attr-defined]
    saved = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        saved = out_dir / f"{workload.name}.prof"
        profiler.dump_stats(saved)
    return {
        "name": workload.name,
        "agent_steps_per_s_profiled": window.agent_steps_per_s,
        "total_s": total,
        "profile_file": str(saved) if saved else None,
        "top": [
            {
                "function": f"{_short(filename)}:{line}({func})",
                "ncalls": int(ncalls),
                "tottime_s": tottime,
                "tottime_pct": tottime / total * 100.0,
                "cumtime_s": cumtime,
            }
            for (filename, line, func), (_, ncalls, tottime, cumtime, _) in rows[:top]
        ],
    }
