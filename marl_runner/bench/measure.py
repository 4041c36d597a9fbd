"""Timed measurements: runner vs bare loop, subprocess vs sync.

Every throughput number is agent steps per second over a timed window that
follows a warm-up, the median over several windows. Runner and bare loop
windows alternate, so slow drifts of the machine hit both alike.
"""

from __future__ import annotations

import resource
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import psutil

from marl_runner.bench.bare_loop import BareLoop
from marl_runner.bench.least_work import LeastWorkLoop
from marl_runner.bench.workloads import Workload
from marl_runner.config import RunnerConfig
from marl_runner.sampling.runner import EnvRunner

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Settings:
    """How long to measure; ``smoke`` shrinks everything to a handful of rounds."""

    duration_s: float = 5.0
    warmup_s: float = 2.0
    repeats: int = 3
    rollout_fragment_length: int = 200
    min_bare_rounds: int = 1
    seed: int = 0
    torch_threads: int = 1
    smoke: bool = False
    #: The bare loop's forward pass (bare_loop.BARE_FORWARDS).
    bare_forward: str = "numpy"
    #: Also time the least-work loop (least_work.py) in the throughput mode.
    least_work: bool = False

    @classmethod
    def for_smoke(
        cls, seed: int = 0, torch_threads: int = 1, bare_forward: str = "numpy", least_work: bool = False
    ) -> Settings:
        """One short window each: checks that everything runs, measures nothing useful."""
        return cls(
            duration_s=0.0,
            warmup_s=0.0,
            repeats=1,
            rollout_fragment_length=5,
            min_bare_rounds=5,
            seed=seed,
            torch_threads=torch_threads,
            smoke=True,
            bare_forward=bare_forward,
            least_work=least_work,
        )

    def config(
        self,
        workload: Workload,
        vectorize: str = "sync",
        num_workers: int | None = None,
        async_poll: bool = False,
    ) -> RunnerConfig:
        """The workload's runner config under these settings."""
        return workload.config(
            vectorize=vectorize,
            num_workers=num_workers,
            seed=self.seed,
            rollout_fragment_length=self.rollout_fragment_length,
            torch_threads=self.torch_threads,
            async_poll=async_poll,
        )


def rss_mb() -> float:
    """Resident set size of this process now."""
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """High-water mark of this process's RSS (since it started, all workloads so far)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


@dataclass
class RunnerWindow:
    """One timed stretch of ``runner.sample()`` calls."""

    agent_steps: int
    env_steps: int
    elapsed_s: float
    calls: int
    max_rss_mb: float
    perf: dict[str, float]

    @property
    def agent_steps_per_s(self) -> float:
        """The window's throughput, the figure the runner and the bare loop are compared by."""
        return self.agent_steps / max(self.elapsed_s, 1e-9)


def time_runner(runner: EnvRunner, duration_s: float, min_calls: int = 1) -> RunnerWindow:
    """``runner.sample()`` (one fragment per sub-env, as in training) until the time is up.

    Each batch is dropped right away, as a trainer would after using it.
    Steps come from ``get_metrics()`` (``num_agent_steps``: closed
    transitions), which is reset just before the window. The clock only runs
    inside ``sample()``; RSS is read between calls, with the batch alive.
    """
    runner.get_metrics()
    elapsed, calls, max_rss = 0.0, 0, 0.0
    while calls < min_calls or elapsed < duration_s:
        start = perf_counter()
        batch = runner.sample()
        elapsed += perf_counter() - start
        calls += 1
        max_rss = max(max_rss, rss_mb())
        del batch
    metrics = runner.get_metrics()
    return RunnerWindow(
        metrics["num_agent_steps"],
        metrics["num_env_steps"],
        elapsed,
        calls,
        max_rss,
        dict(metrics["perf"]),
    )


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _ms_per_round(elapsed_s: float, rounds: float) -> float:
    return elapsed_s * 1000.0 / rounds if rounds > 0 else float("nan")


def compare_workload(
    workload: Workload,
    settings: Settings,
    *,
    vectorize: str = "sync",
    num_workers: int | None = None,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Runner and bare loop (and, with ``settings.least_work``, the least-work loop) on the
    same config, windows alternating; medians and ratios."""
    config = settings.config(workload, vectorize, num_workers)
    setup_start = perf_counter()
    runner = EnvRunner(config)
    bare = BareLoop(config, settings.bare_forward)
    least_work = LeastWorkLoop(config) if settings.least_work else None
    setup_s = perf_counter() - setup_start
    runner_windows: list[RunnerWindow] = []
    bare_rates: list[float] = []
    bare_windows = []
    least_work_rates: list[float] = []
    loops = [(bare, bare_rates, bare_windows)]
    if least_work is not None:
        loops.append((least_work, least_work_rates, []))
    try:
        progress(f"{workload.name}: warm-up")
        time_runner(runner, settings.warmup_s)
        for loop, _, _ in loops:
            loop.run(duration_s=settings.warmup_s, min_rounds=settings.min_bare_rounds)
        for repeat in range(settings.repeats):
            progress(f"{workload.name}: repeat {repeat + 1}/{settings.repeats}")
            runner_windows.append(time_runner(runner, settings.duration_s))
            for loop, rates, windows in loops:
                window = loop.run(duration_s=settings.duration_s, min_rounds=settings.min_bare_rounds)
                windows.append(window)
                rates.append(window.agent_steps / max(window.elapsed_s, 1e-9))
    finally:
        runner.stop()
        for loop, _, _ in loops:
            loop.stop()
    runner_rates = [w.agent_steps_per_s for w in runner_windows]
    target = workload.target_ratio if settings.bare_forward == "numpy" else None
    runner_median, bare_median = _median(runner_rates), _median(bare_rates)
    ratio = runner_median / bare_median if bare_median > 0 else float("nan")
    last_bare = bare_windows[-1]
    return {
        "name": workload.name,
        "description": workload.description,
        "num_envs": config.num_envs,
        "vectorize": config.vectorize,
        "num_workers": config.num_workers,
        "policies": list(config.policies),
        "setup_s": setup_s,
        "runner": {
            "agent_steps_per_s": runner_median,
            "repeats": runner_rates,
            "agent_steps": sum(w.agent_steps for w in runner_windows),
            "env_steps": sum(w.env_steps for w in runner_windows),
            "elapsed_s": sum(w.elapsed_s for w in runner_windows),
            "sample_calls": sum(w.calls for w in runner_windows),
            "wall_ms_per_round": _ms_per_round(
                sum(w.elapsed_s for w in runner_windows),
                sum(w.env_steps for w in runner_windows) / config.num_envs,
            ),
            # Global mean over every runner step of this workload (warm-up included).
            "perf": runner_windows[-1].perf,
        },
        "bare": {
            "agent_steps_per_s": bare_median,
            "repeats": bare_rates,
            "agent_steps": sum(w.agent_steps for w in bare_windows),
            "env_steps": sum(w.env_steps for w in bare_windows),
            "elapsed_s": sum(w.elapsed_s for w in bare_windows),
            "rounds": sum(w.rounds for w in bare_windows),
            "wall_ms_per_round": _ms_per_round(
                sum(w.elapsed_s for w in bare_windows), sum(w.rounds for w in bare_windows)
            ),
            "perf": last_bare.perf_ms(),
        },
        "ratio": ratio,
        **_least_work_result(least_work_rates, bare_median),
        # The targets are set against the numpy bare loop; against the torch one there are none.
        "target_ratio": target,
        "meets_target": None if target is None else bool(ratio >= target),
        "runner_max_rss_mb": max(w.max_rss_mb for w in runner_windows),
        "peak_rss_mb": peak_rss_mb(),
    }


def _least_work_result(rates: list[float], bare_median: float) -> dict[str, Any]:
    """The least-work loop's median and its ratio to the bare loop, when it was timed."""
    if not rates:
        return {}
    median = _median(rates)
    return {
        "least_work": {"agent_steps_per_s": median, "repeats": rates},
        "least_work_ratio": median / bare_median if bare_median > 0 else float("nan"),
    }


def process_tree_cpu_s() -> float:
    """CPU time (user + system) of this process and all its descendants (env workers)."""
    me = psutil.Process()
    total = 0.0
    for process in (me, *me.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _subprocess_breakdown(
    stats: list[dict[str, float]], windows: list[RunnerWindow], num_envs: int, num_workers: int
) -> dict[str, float]:
    """Where a SubprocessVectorEnv round (``num_envs`` env steps) goes, in ms.

    ``main_busy`` is the main process not blocked on workers (the runner's own
    work plus IPC); ``worker_env`` is one worker's time inside env
    ``step``/``reset``; ``worker_idle`` one worker's time not serving a
    step request (waiting for the main process, or for the CPU).
    """
    rounds = sum(w.env_steps for w in windows) / num_envs
    elapsed = sum(w.elapsed_s for w in windows)
    if rounds <= 0:
        return {}
    total = {key: sum(s[key] for s in stats) for key in stats[0]}
    ms = 1000.0 / rounds
    wall = elapsed * ms
    worker_busy = total["worker_busy_s"] * ms / num_workers
    return {
        "wall_ms": wall,
        "main_busy_ms": wall - total["parent_wait_s"] * ms,
        "main_ipc_ms": total["parent_ipc_s"] * ms,
        "main_wait_ms": total["parent_wait_s"] * ms,
        "worker_env_ms": total["worker_env_s"] * ms / num_workers,
        "worker_overhead_ms": (total["worker_busy_s"] - total["worker_env_s"]) * ms / num_workers,
        "worker_idle_ms": wall - worker_busy,
        "polls_per_round": total["polls"] / rounds,
        "prefetched_resets_per_round": total["prefetched_resets"] / rounds,
        "reset_round_trips_per_round": total["reset_round_trips"] / rounds,
    }


def subprocess_speedup(
    workload: Workload,
    settings: Settings,
    *,
    num_workers: int = 2,
    async_poll: bool = False,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Runner throughput with ``vectorize: subprocess`` over ``sync``, windows alternating.

    With ``async_poll`` the asynchronous subprocess protocol is measured too
    (``subprocess_async``, ``speedup_async``). Each mode reports the CPU cores
    its processes used; subprocess modes also a per-round breakdown.
    """
    configs = {
        "sync": settings.config(workload, "sync"),
        "subprocess": settings.config(workload, "subprocess", num_workers),
    }
    if async_poll:
        configs["subprocess_async"] = settings.config(
            workload, "subprocess", num_workers, async_poll=True
        )
    label = " vs ".join(configs)
    runners: dict[str, EnvRunner] = {}
    windows: dict[str, list[RunnerWindow]] = {mode: [] for mode in configs}
    cores: dict[str, list[float]] = {mode: [] for mode in configs}
    env_stats: dict[str, list[dict[str, float]]] = {mode: [] for mode in configs}
    try:
        for mode, config in configs.items():
            runners[mode] = EnvRunner(config)
        progress(f"{workload.name} {label}: warm-up")
        for runner in runners.values():
            time_runner(runner, settings.warmup_s)
        for repeat in range(settings.repeats):
            progress(f"{workload.name} {label}: repeat {repeat + 1}/{settings.repeats}")
            for mode, runner in runners.items():
                reset_stats = getattr(runner.env, "reset_stats", None)
                if reset_stats is not None:
                    reset_stats()
                cpu_start, clock = process_tree_cpu_s(), perf_counter()
                windows[mode].append(time_runner(runner, settings.duration_s))
                cores[mode].append(
                    (process_tree_cpu_s() - cpu_start) / max(perf_counter() - clock, 1e-9)
                )
                if reset_stats is not None:
                    env_stats[mode].append(runner.env.stats.as_dict())
    finally:
        for runner in runners.values():
            runner.stop()
    result: dict[str, Any] = {
        "name": workload.name,
        "num_envs": workload.num_envs,
        "num_workers": configs["subprocess"].num_workers,
    }
    for mode, mode_windows in windows.items():
        rates = [w.agent_steps_per_s for w in mode_windows]
        result[mode] = {
            "agent_steps_per_s": _median(rates),
            "repeats": rates,
            "cpu_cores": _median(cores[mode]),
            "perf": mode_windows[-1].perf,
        }
        if env_stats[mode]:
            result[mode]["breakdown"] = _subprocess_breakdown(
                env_stats[mode], mode_windows, workload.num_envs, configs[mode].num_workers
            )
    sync_rate = result["sync"]["agent_steps_per_s"]
    for mode, key in (("subprocess", "speedup"), ("subprocess_async", "speedup_async")):
        if mode in result:
            result[key] = (
                result[mode]["agent_steps_per_s"] / sync_rate if sync_rate > 0 else float("nan")
            )
    return result
