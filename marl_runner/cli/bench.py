"""``marl-runner bench``: forwards every argument to the benchmark CLI (``marl_runner.bench``)."""

from __future__ import annotations

from typing import Any

__all__ = ["add_bench_parser", "run_bench"]


def add_bench_parser(commands: Any) -> None:
    """Registers ``bench``; its arguments are the benchmark CLI's, so it has no help of its own."""
    commands.add_parser(
        "bench",
        add_help=False,
        help="runner vs bare loop, populations, process backends, serving "
        "(`marl-runner bench --help` lists the modes)",
    )


def run_bench(argv: list[str]) -> int:
    """Runs the benchmark CLI on ``argv``; imported here, since it imports torch and the envs."""
    from marl_runner.bench.cli import main

    return int(main(argv) or 0)
