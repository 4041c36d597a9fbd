"""``marl-runner bench`` / ``python -m benchmarks``: the runner against the bare loop.

Modes (combine freely; none given means ``--throughput``):

- ``--throughput``: runner vs bare loop per workload, agent steps/s, ratio, RSS,
  and the per-phase breakdown.
- ``--memory``: RSS growth of the runner between 200k and 1M agent steps (cheap).
- ``--subprocess-speedup``: runner with ``vectorize: subprocess`` vs ``sync`` on
  env-bound workloads (kaz, pistonball); ``--async-poll`` adds the asynchronous
  subprocess protocol; both with a per-round breakdown of where the time goes.
- ``--profile``: cProfile of the runner per workload, top functions by own time.
- ``--all``: the first three.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from benchmarks.measure import Settings, compare_workload, memory_growth, subprocess_speedup
from benchmarks.profiling import profile_workload
from benchmarks.report import print_report
from benchmarks.workloads import DEFAULT_WORKLOADS, SUBPROCESS_WORKLOADS, WORKLOADS, get_workload

SCHEMA_VERSION = 1


def build_parser() -> argparse.ArgumentParser:
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
    modes = parser.add_argument_group("modes (default: --throughput)")
    modes.add_argument(
        "--throughput",
        action="store_true",
        help="runner vs bare loop: agent steps/s, ratio, RSS, per-phase times",
    )
    modes.add_argument(
        "--memory",
        action="store_true",
        help="RSS growth between --memory-start and --memory-end agent steps",
    )
    modes.add_argument(
        "--subprocess-speedup",
        action="store_true",
        help=f"runner, vectorize subprocess vs sync ({', '.join(SUBPROCESS_WORKLOADS)}, "
        "or those of them named)",
    )
    modes.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the runner on each workload; top functions by own time",
    )
    modes.add_argument(
        "--all", action="store_true", help="--throughput --memory --subprocess-speedup"
    )
    modes.add_argument(
        "--scaling",
        action="store_true",
        help="agent steps/s on KAZ and simple_spread: sync, subprocess, vectorize ray, and "
        "runner groups of 1, 2, 4 (needs Ray; Ray start-up reported apart)",
    )
    modes.add_argument(
        "--external",
        action="store_true",
        help="serving 16 concurrent client threads (vectorize: external), in-process and over "
        "HTTP on loopback: actions/s, get_action median/p99 latency, wire codec cost",
    )
    modes.add_argument(
        "--soak",
        type=float,
        default=None,
        metavar="MINUTES",
        help="sample MINUTES with random faults (exceptions, os._exit, hangs; restarts on) "
        "and report episodes, faults, restarts, healthy rows lost, RSS and open files",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a handful of rounds per workload: checks the bench works (CI)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds per timed window (default 5)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds of warm-up per side before timing (default 2)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed windows per side; the median is reported (default 3)",
    )
    parser.add_argument(
        "--vectorize",
        choices=("sync", "subprocess"),
        default="sync",
        help="vector env for runner and bare loop alike (default sync)",
    )
    parser.add_argument(
        "--async-poll",
        action="store_true",
        help="--subprocess-speedup: also measure the asynchronous subprocess protocol "
        "(async_poll: true)",
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes for vectorize subprocess (default: the env's "
        "choice; 2 for --subprocess-speedup)",
    )
    parser.add_argument("--memory-start", type=int, default=200_000, metavar="STEPS")
    parser.add_argument("--memory-end", type=int, default=1_000_000, metavar="STEPS")
    parser.add_argument(
        "--profile-top",
        type=int,
        default=15,
        metavar="N",
        help="functions listed per profile (default 15)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="also save each full profile as DIR/<workload>.prof",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        metavar="N",
        help="torch.set_num_threads for both sides (default 1)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (tables go to stderr)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the JSON results to FILE",
    )
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    if args.smoke:
        return Settings.for_smoke(seed=args.seed, torch_threads=args.torch_threads)
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
    """Runs the selected modes; returns 0 (the bench reports targets, it does not enforce them)."""
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
    torch.set_num_threads(args.torch_threads)
    if args.scaling:
        from benchmarks.scaling import measure_scaling, print_scaling

        duration = 2.0 if settings.smoke else settings.duration_s
        scaling = measure_scaling(
            duration_s=duration, warmup_s=min(settings.warmup_s, duration),
            progress=lambda msg: print(msg, file=sys.stderr),
        )
        print_scaling(scaling, Console())
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(scaling, indent=2) + "\n")
        return 0
    if args.external:
        from benchmarks.external import external_benchmark, print_external

        external = external_benchmark(
            settings.duration_s, settings.smoke, progress=lambda msg: print(msg, file=sys.stderr)
        )
        print_external(Console(), external)
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(external, indent=2) + "\n")
        return 0
    if args.soak is not None:
        from benchmarks.soak import print_soak, run_soak

        soak = run_soak(args.soak, seed=args.seed, progress=lambda msg: print(msg, file=sys.stderr))
        print_soak(soak)
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(soak, indent=2) + "\n")
        return 0 if soak["healthy_rows_lost"] == 0 else 1
    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = 120  # logs and CI: do not squeeze the tables into 80 columns
    progress = (lambda msg: console.log(msg)) if not args.json else (lambda msg: None)
    throughput = (
        args.throughput or args.all or not (args.memory or args.subprocess_speedup or args.profile)
    )
    started = time.perf_counter()
    report: dict[str, Any] = {"meta": _meta(args, settings), "workloads": []}
    if throughput:
        for name in names:
            report["workloads"].append(
                compare_workload(
                    get_workload(name),
                    settings,
                    vectorize=args.vectorize,
                    num_workers=args.num_workers,
                    progress=progress,
                )
            )
    if args.memory or args.all:
        start, end = (5_000, 10_000) if settings.smoke else (args.memory_start, args.memory_end)
        report["memory"] = memory_growth(
            settings,
            start_steps=start,
            end_steps=end,
            every_steps=max(end // 10, 1),
            vectorize=args.vectorize,
            num_workers=args.num_workers,
            progress=progress,
        )
    if args.subprocess_speedup or args.all:
        # Named workloads pick among the env-bound ones; none of them named: all.
        subprocess_names = [n for n in names if n in SUBPROCESS_WORKLOADS] or list(
            SUBPROCESS_WORKLOADS
        )
        report["subprocess"] = [
            subprocess_speedup(
                get_workload(name),
                settings,
                num_workers=args.num_workers or 2,
                async_poll=args.async_poll,
                progress=progress,
            )
            for name in subprocess_names
        ]
    if args.profile:
        report["profiles"] = [
            profile_workload(
                get_workload(name),
                settings,
                top=args.profile_top,
                out_dir=args.profile_dir,
                vectorize=args.vectorize,
                num_workers=args.num_workers,
                progress=progress,
            )
            for name in names
        ]
    report["total_s"] = time.perf_counter() - started
    print_report(console, report)
    text = json.dumps(report, indent=2, default=str)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    if args.json:
        print(text)
    return 0
