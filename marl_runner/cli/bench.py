"""``marl-runner bench``: forwards every argument to the repository's benchmark CLI."""

from __future__ import annotations

import sys
from typing import Any

from connectors.imports import ImportPathError, import_object
from marl_runner.cli.common import EXIT_BAD_CONFIG

__all__ = ["BENCH_ENTRY_POINT", "add_bench_parser", "run_bench"]

BENCH_ENTRY_POINT = "benchmarks.cli:main"


def add_bench_parser(commands: Any) -> None:
    """Registers ``bench``; its arguments are the benchmark CLI's, so it has no help of its own."""
    commands.add_parser(
        "bench",
        add_help=False,
        help=f"run the benchmarks (all arguments go to {BENCH_ENTRY_POINT}; "
        "run from the repository root)",
    )


def run_bench(argv: list[str]) -> int:
    """Runs ``benchmarks.cli:main(argv)``; the benchmarks live in the repository, not the package."""
    try:
        bench_main = import_object(BENCH_ENTRY_POINT)
    except ImportPathError as exc:
        print(
            f"marl-runner bench: error: {exc}; the benchmarks live in the repository's "
            "benchmarks/ folder, so run this from the repository root",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    return int(bench_main(argv) or 0)
