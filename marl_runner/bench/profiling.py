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

from marl_runner.bench.measure import Progress, Settings, _quiet, time_runner
from marl_runner.bench.workloads import Workload
from marl_runner.sampling.runner import EnvRunner

_PREFIXES = sorted(
    {p for p in (os.getcwd(), *sys.path) if p and os.path.isdir(p)}, key=len, reverse=True
)


def _is_runner_code(filename: str) -> bool:
    """The runner's own code: what its authors can optimise (not envs, torch or numpy)."""
    path = filename.replace(os.sep, "/")
    return ("/marl_runner/" in path and "/marl_runner/envs/" not in path) or "/connectors/" in path


def _short(filename: str) -> str:
    """Paths relative to the repo or site-packages, so the table stays readable."""
    for prefix in _PREFIXES:
        if filename.startswith(prefix + os.sep):
            return filename[len(prefix) + 1 :]
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

    Returns the ``top`` functions by own time (tottime), overall and within
    the runner's own code (``marl_runner`` outside ``envs``, ``connectors``); with ``out_dir``
    the full profile is saved as ``<workload>.prof`` (``python -m pstats``,
    snakeviz).
    """
    config = settings.config(workload, vectorize, num_workers)
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
    runner_rows = [row for row in rows if _is_runner_code(row[0][0])]
    return {
        "name": workload.name,
        "agent_steps_per_s_profiled": window.agent_steps_per_s,
        "total_s": total,
        "profile_file": str(saved) if saved else None,
        "top": [_row(item, total) for item in rows[:top]],
        "top_runner_code": [_row(item, total) for item in runner_rows[:top]],
    }


def _row(item: tuple, total: float) -> dict[str, Any]:
    (filename, line, func), (_, ncalls, tottime, cumtime, _) = item
    return {
        "function": f"{_short(filename)}:{line}({func})",
        "ncalls": int(ncalls),
        "tottime_s": tottime,
        "tottime_pct": tottime / total * 100.0,
        "cumtime_s": cumtime,
    }
