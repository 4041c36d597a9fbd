"""``marl-runner bench`` / ``python -m marl_runner.bench``: the runner against the bare loop.

Modes (combine freely; none given means ``--throughput``):

- ``--throughput``: runner vs bare loop per workload, agent steps/s, ratio, RSS,
  and the per-phase breakdown.
- ``--memory``: RSS growth between 200k and 1M agent steps (cheap) on each vector env
  backend (``--memory-backends``): the main process and every env worker or actor.
- ``--subprocess-speedup``: runner with ``vectorize: subprocess`` vs ``sync`` on
  env-bound workloads (kaz, pistonball); ``--async-poll`` adds the asynchronous
  subprocess protocol; both with a per-round breakdown of where the time goes.
- ``--process-speedup``: env steps/s of the bare loop and of the runner, each
  over sync and over subprocess sub-envs (kaz, spread, cheap), and the ratios.
- ``--slow-sub-env``: one sub-env in eight 10x slower; the others' env steps/s
  with every poll waiting for all and with async pools.
- ``--profile``: cProfile of the runner per workload, top functions by own time.
- ``--all``: all of these but the profile.

Standalone modes run alone with their own report: ``--scaling``, ``--external``,
``--soak MINUTES``, ``--soak-serve MINUTES`` (the soaks exit 1 when data was lost
or something failed).

``--smoke`` shrinks every mode to a handful of rounds (what CI runs).
Torch runs with one thread (``--torch-threads``) on both sides: the machine
the targets were set on has 2 cores, and the bare loop and the runner then
do their matrix products on the same footing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from marl_runner.bench.bare_loop import BARE_FORWARDS
from marl_runner.bench.machine_load import other_cpus, take_sample
from marl_runner.bench.measure import Settings, compare_workload, subprocess_speedup
from marl_runner.bench.memory_backends import (
    MEMORY_BACKENDS,
    RAY_NUM_ENVS,
    memory_growth,
    parse_backends,
)
from marl_runner.bench.population import measure_population
from marl_runner.bench.profiling import profile_workload
from marl_runner.bench.report import print_report
from marl_runner.bench.subprocess_pools import SPEEDUP_WORKLOADS, slow_sub_env, vector_speedup
from marl_runner.bench.workloads import (
    DEFAULT_WORKLOADS,
    POPULATION_WORKLOADS,
    SUBPROCESS_WORKLOADS,
    WORKLOADS,
    get_workload,
)
from marl_runner.policy.torch_utils import limit_inference_threads

SCHEMA_VERSION = 1
#: What ``--all`` runs: every report mode but the profile (the soaks run alone).
ALL_MODES = ("throughput", "memory", "subprocess_speedup", "process_speedup", "slow_sub_env")
#: ``--slow-sub-env`` window under ``--smoke``: a zero-length window would count no steps.
SMOKE_WINDOW_S = 0.2
#: ``--memory`` sub-envs under ray with ``--smoke``: each is a process to start.
SMOKE_RAY_ENVS = 2
Progress = Callable[[str], None]


def build_parser() -> argparse.ArgumentParser:
    """The bench's flags, one group per concern."""
    parser = argparse.ArgumentParser(
        prog="marl-runner bench",
        description="Measure the runner against a bare sampling loop on the same workloads.",
    )
    parser.add_argument(
        "workloads",
        nargs="*",
        metavar="WORKLOAD",
        help=f"workloads to measure (default: {' '.join(DEFAULT_WORKLOADS)}; "
        f"also: {' '.join(sorted(set(WORKLOADS) - set(DEFAULT_WORKLOADS)))})",
    )
    _add_report_modes(parser)
    _add_standalone_modes(parser)
    _add_timing_options(parser)
    _add_vector_env_options(parser)
    _add_mode_options(parser)
    _add_output_options(parser)
    return parser


def _add_report_modes(parser: argparse.ArgumentParser) -> None:
    """Modes that measure into one report (tables, JSON); any mix of them."""
    modes = parser.add_argument_group("modes (default: --throughput)")
    modes.add_argument(
        "--throughput", action="store_true",
        help="runner vs bare loop: agent steps/s, ratio, RSS, per-phase times",
    )
    modes.add_argument(
        "--memory", action="store_true",
        help="RSS growth between --memory-start and --memory-end agent steps on each of "
        "--memory-backends: main process and every env worker or actor",
    )
    modes.add_argument(
        "--subprocess-speedup", action="store_true",
        help=f"runner, vectorize subprocess vs sync ({', '.join(SUBPROCESS_WORKLOADS)}, "
        "or those of them named)",
    )
    modes.add_argument(
        "--process-speedup", action="store_true",
        help="env steps/s of bare loop and runner, each over sync and subprocess sub-envs "
        f"({', '.join(SPEEDUP_WORKLOADS)}, or those of them named)",
    )
    modes.add_argument(
        "--slow-sub-env", action="store_true",
        help="one sub-env in eight 10x slower: the others' env steps/s with and without "
        "async pools (num_envs_per_poll)",
    )
    modes.add_argument(
        "--profile", action="store_true",
        help="cProfile the runner on each workload; top functions by own time",
    )
    modes.add_argument(
        "--population", action="store_true",
        help=f"many agents per env ({', '.join(POPULATION_WORKLOADS)}, or those of them named), "
        "sync and subprocess: agent steps/s and us per agent step of runner and bare loops "
        "(numpy and torch forward), peak RSS beyond the build per batch, bytes per row",
    )
    modes.add_argument(
        "--all", action="store_true",
        help=" ".join(f"--{mode.replace('_', '-')}" for mode in ALL_MODES),
    )


def _add_standalone_modes(parser: argparse.ArgumentParser) -> None:
    """Modes that run alone, each with its own report."""
    modes = parser.add_argument_group("standalone modes (one at a time, the others ignored)")
    modes.add_argument(
        "--scaling", action="store_true",
        help="agent steps/s on KAZ and simple_spread: sync, subprocess, vectorize ray, and "
        "runner groups of 1, 2, 4 (needs Ray; Ray start-up reported apart)",
    )
    modes.add_argument(
        "--external", action="store_true",
        help="marl-runner serve in its own process, 16 and 64 client threads in other "
        "processes over loopback: get_action calls/s, p50/p99 latency, errors, CPU per call, "
        "episodes finished vs written, wire codec cost",
    )
    modes.add_argument(
        "--soak", type=float, default=None, metavar="MINUTES",
        help="sample MINUTES with random faults (exceptions, os._exit, hangs; restarts on) "
        "and report episodes, faults, restarts, healthy rows lost, RSS and open files",
    )
    modes.add_argument(
        "--soak-serve", type=float, default=None, metavar="MINUTES",
        help="serve MINUTES to remote, local, killed and hostile clients at once; exits 1 "
        "unless what clients finished equals what was written and nothing failed",
    )


def _add_timing_options(parser: argparse.ArgumentParser) -> None:
    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--smoke", action="store_true",
        help="a handful of rounds per workload: checks the bench works (CI)",
    )
    timing.add_argument(
        "--duration", type=float, default=5.0, metavar="S",
        help="seconds per timed window (default 5)",
    )
    timing.add_argument(
        "--warmup", type=float, default=2.0, metavar="S",
        help="seconds of warm-up per side before timing (default 2)",
    )
    timing.add_argument(
        "--repeats", type=int, default=3,
        help="timed windows per side; the median is reported (default 3)",
    )
    timing.add_argument("--seed", type=int, default=0, help="config seed (default 0)")
    timing.add_argument(
        "--bare-forward", choices=BARE_FORWARDS, default="numpy",
        help="the bare loop's forward pass (throughput mode): numpy (default), as the runner "
        "runs the built-in mlp on CPU, so the ratio measures the runner's own work and the "
        "targets are set against it; or torch (a torch module call per policy and round)",
    )
    timing.add_argument(
        "--least-work", action="store_true",
        help="throughput mode (the other modes ignore it): also time the least-work loop, the "
        "numpy bare loop plus what any sampler that hands out batches adds (rewards, infos, "
        "stored columns, trajectory order), the fastest way we wrote: a ceiling for the "
        "runner's ratio on small rows",
    )
    timing.add_argument(
        "--torch-threads", type=int, default=1, metavar="N",
        help="torch and BLAS threads for both sides (limit_inference_threads; default 1)",
    )


def _add_vector_env_options(parser: argparse.ArgumentParser) -> None:
    vector = parser.add_argument_group("vector env")
    vector.add_argument(
        "--vectorize", choices=("sync", "subprocess"), default="sync",
        help="vector env for runner and bare loop alike (default sync); --memory measures "
        "--memory-backends instead",
    )
    vector.add_argument(
        "--async-poll", action="store_true",
        help="--subprocess-speedup: also measure the asynchronous subprocess protocol "
        "(async_poll: true)",
    )
    vector.add_argument(
        "--num-workers", type=int, default=None, metavar="N",
        help="worker processes for vectorize subprocess (default: the env's choice; 2 for "
        "--memory, --subprocess-speedup and --process-speedup)",
    )


def _add_mode_options(parser: argparse.ArgumentParser) -> None:
    options = parser.add_argument_group("mode options")
    options.add_argument(
        "--memory-start", type=int, default=200_000, metavar="STEPS",
        help="--memory: agent steps before the first RSS reading (default 200,000)",
    )
    options.add_argument(
        "--memory-end", type=int, default=1_000_000, metavar="STEPS",
        help="--memory: agent steps at the last RSS reading (default 1,000,000)",
    )
    options.add_argument(
        "--memory-backends", type=_memory_backends, default=MEMORY_BACKENDS, metavar="LIST",
        help=f"--memory: comma-separated backends (default {','.join(MEMORY_BACKENDS)}; ray "
        "is skipped with the reason when Ray is not installed)",
    )
    options.add_argument(
        "--profile-top", type=int, default=15, metavar="N",
        help="functions listed per profile (default 15)",
    )
    options.add_argument(
        "--profile-dir", type=Path, default=None, metavar="DIR",
        help="also save each full profile as DIR/<workload>.prof",
    )


def _memory_backends(text: str) -> tuple[str, ...]:
    try:
        return parse_backends(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("output")
    output.add_argument(
        "--json", action="store_true",
        help="print the results as JSON on stdout (tables go to stderr)",
    )
    output.add_argument(
        "--output", type=Path, default=None, metavar="FILE",
        help="also write the JSON results to FILE",
    )


def _settings(args: argparse.Namespace) -> Settings:
    if args.least_work and args.bare_forward != "numpy":
        raise SystemExit("marl-runner bench: --least-work runs the numpy forward pass; drop --bare-forward torch")
    if args.smoke:
        return Settings.for_smoke(
            seed=args.seed, torch_threads=args.torch_threads, bare_forward=args.bare_forward,
            least_work=args.least_work,
        )
    if args.duration < 0 or args.warmup < 0 or args.repeats < 1 or args.torch_threads < 1:
        raise SystemExit(
            "marl-runner bench: --duration/--warmup must be >= 0, --repeats/--torch-threads >= 1"
        )
    return Settings(
        duration_s=args.duration,
        warmup_s=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
        torch_threads=args.torch_threads,
        bare_forward=args.bare_forward,
        least_work=args.least_work,
    )


def _meta(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "smoke": settings.smoke,
        "duration_s": settings.duration_s,
        "warmup_s": settings.warmup_s,
        "repeats": settings.repeats,
        "rollout_fragment_length": settings.rollout_fragment_length,
        "seed": settings.seed,
        "vectorize": args.vectorize,
        "num_workers": args.num_workers,
        "async_poll": args.async_poll,
        "bare_forward": settings.bare_forward,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "agent_step": "one agent observation acted on (runner: num_agent_steps, closed "
        "transitions; bare loop: actions sent)",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the selected modes; returns 0 (the bench reports targets, it does not enforce
    them), but 1 when a soak lost data or failed, 2 on bad arguments."""
    args = build_parser().parse_args(argv)
    try:
        names = [get_workload(name).name for name in args.workloads] or list(DEFAULT_WORKLOADS)
    except ValueError as exc:
        print(f"marl-runner bench: error: {exc}", file=sys.stderr)
        return 2
    settings = _settings(args)
    if not 0 < args.memory_start < args.memory_end:
        print(
            "marl-runner bench: error: expected 0 < --memory-start < --memory-end", file=sys.stderr
        )
        return 2
    limit_inference_threads(args.torch_threads)
    standalone = _run_standalone(args, settings)
    if standalone is not None:
        return standalone
    console = Console(stderr=args.json, log_path=False)
    if not console.is_terminal:
        console.width = 120  # logs and CI: do not squeeze the tables into 80 columns
    progress = (lambda msg: console.log(msg)) if not args.json else (lambda msg: None)
    started = time.perf_counter()
    load_start = take_sample()
    report: dict[str, Any] = {"meta": _meta(args, settings), "workloads": []}
    report.update(_measure(args, names, settings, progress))
    report["total_s"] = time.perf_counter() - started
    report["meta"]["other_cpus"] = other_cpus(load_start, take_sample())
    print_report(console, report)
    text = json.dumps(report, indent=2, default=str)
    if args.output is not None:
        _write_json(args.output, text)
    if args.json:
        print(text)
    return 0


def _measure(
    args: argparse.Namespace, names: list[str], settings: Settings, progress: Progress
) -> dict[str, Any]:
    """The report's sections for the modes asked for (``--throughput`` when none is)."""
    chosen = {mode for mode in ALL_MODES + ("profile", "population") if getattr(args, mode)}
    if args.all:
        chosen |= set(ALL_MODES)
    sections: dict[str, Any] = {}
    vector = {"vectorize": args.vectorize, "num_workers": args.num_workers}
    if "throughput" in chosen or not chosen:
        sections["workloads"] = [
            compare_workload(get_workload(name), settings, **vector, progress=progress)
            for name in names
        ]
    if "memory" in chosen:
        start, end = (5_000, 10_000) if settings.smoke else (args.memory_start, args.memory_end)
        sections["memory"] = memory_growth(
            settings, backends=args.memory_backends, start_steps=start, end_steps=end,
            every_steps=max(end // 10, 1), num_workers=args.num_workers or 2,
            ray_num_envs=SMOKE_RAY_ENVS if settings.smoke else RAY_NUM_ENVS, progress=progress,
        )
    if "subprocess_speedup" in chosen:
        sections["subprocess"] = [
            subprocess_speedup(
                get_workload(name), settings, num_workers=args.num_workers or 2,
                async_poll=args.async_poll, progress=progress,
            )
            for name in _named_among(names, SUBPROCESS_WORKLOADS)
        ]
    if "process_speedup" in chosen:
        sections["process_speedup"] = vector_speedup(
            _named_among(names, SPEEDUP_WORKLOADS), duration_s=settings.duration_s,
            warmup_s=settings.warmup_s, repeats=settings.repeats,
            num_workers=args.num_workers or 2,
            rollout_fragment_length=settings.rollout_fragment_length, progress=progress,
        )
    if "slow_sub_env" in chosen:
        smoke = {"num_envs": 3, "num_envs_per_poll": 2} if settings.smoke else {}
        sections["slow_sub_env"] = slow_sub_env(
            duration_s=SMOKE_WINDOW_S if settings.smoke else settings.duration_s,
            warmup_s=settings.warmup_s, **smoke,
        )
    if "population" in chosen:
        sections["population"] = measure_population(
            _named_among(names, POPULATION_WORKLOADS), settings,
            num_workers=args.num_workers or 2, progress=progress,
        )
    if "profile" in chosen:
        sections["profiles"] = [
            profile_workload(
                get_workload(name), settings, top=args.profile_top, out_dir=args.profile_dir,
                **vector, progress=progress,
            )
            for name in names
        ]
    return sections


def _named_among(names: list[str], candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The named workloads a mode measures; none of them named: all of its own."""
    return tuple(name for name in names if name in candidates) or candidates


def _run_standalone(args: argparse.Namespace, settings: Settings) -> int | None:
    """Runs the standalone mode asked for and returns the exit code; None when none was."""
    def say(message: str) -> None:
        print(message, file=sys.stderr)

    if args.scaling:
        from marl_runner.bench.scaling import measure_scaling, print_scaling

        duration = 2.0 if settings.smoke else settings.duration_s
        scaling = measure_scaling(
            duration_s=duration, warmup_s=min(settings.warmup_s, duration), progress=say
        )
        print_scaling(scaling, Console())
        return _finish_standalone(args, scaling, ok=True)
    if args.external:
        from marl_runner.bench.external import external_benchmark, print_external

        external = external_benchmark(settings.duration_s, settings.smoke, progress=say)
        print_external(Console(), external)
        return _finish_standalone(args, external, ok=True)
    if args.soak is not None:
        from marl_runner.bench.soak import print_soak, run_soak

        soak = run_soak(args.soak, seed=args.seed, progress=say)
        print_soak(soak)
        return _finish_standalone(args, soak, ok=soak["healthy_rows_lost"] == 0)
    if args.soak_serve is not None:
        from marl_runner.bench import soak_serve

        forwarded = [str(args.soak_serve), "--seed", str(args.seed)]
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            forwarded += ["--output", str(args.output)]
        return soak_serve.main(forwarded)
    return None


def _finish_standalone(args: argparse.Namespace, result: dict[str, Any], *, ok: bool) -> int:
    if args.output is not None:
        _write_json(args.output, json.dumps(result, indent=2))
    return 0 if ok else 1


def _write_json(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
