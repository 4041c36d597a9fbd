"""``main`` and the parser: each command adds its own subparser and runs itself."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path

from marl_runner.cli.bench import add_bench_parser, run_bench
from marl_runner.cli.common import CommandError
from marl_runner.cli.config_doc import add_config_doc_parser, run_config_doc
from marl_runner.cli.evaluate import add_evaluate_parser, run_evaluate
from marl_runner.cli.plot import add_plot_parser, run_plot
from marl_runner.cli.sample import add_sample_parser, run_sample
from marl_runner.cli.serve import add_serve_parser, run_serve
from marl_runner.cli.stopping import exit_code_of, sigterm_as_interrupt
from marl_runner.cli.validate import add_validate_parser, run_validate

__all__ = ["build_parser", "main"]

#: What each command runs; ``bench`` takes its raw arguments instead (see ``main``).
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "sample": run_sample,
    "validate": run_validate,
    "serve": run_serve,
    "evaluate": run_evaluate,
    "plot": run_plot,
    "config-doc": run_config_doc,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI and returns its exit code (the console script exits with it)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    _import_from_cwd()
    if args.command == "bench":
        return run_bench(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with sigterm_as_interrupt():
            return COMMANDS[args.command](args)
    except CommandError as exc:
        if args.traceback:
            traceback.print_exc()
        print(f"marl-runner {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # a command with no clean-up of its own to do
        print(f"marl-runner {args.command}: interrupted", file=sys.stderr)
        return exit_code_of(exc)


def build_parser() -> argparse.ArgumentParser:
    """The ``marl-runner`` parser with every command's subparser."""
    parser = argparse.ArgumentParser(
        prog="marl-runner",
        description="Sample multi-agent RL episodes from PettingZoo envs into per-policy batches.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('marl-runner')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = config_arguments()
    add_sample_parser(commands, common)
    add_validate_parser(commands, common)
    add_serve_parser(commands, common)
    add_evaluate_parser(commands)
    add_plot_parser(commands)
    add_bench_parser(commands)
    add_config_doc_parser(commands)
    return parser


def config_arguments() -> argparse.ArgumentParser:
    """The parent parser of the commands that run a config: CONFIG, --set, --traceback."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", type=Path, help="YAML run config (see examples/configs/)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config entry; dotted keys reach nested entries and the value is "
        "parsed as YAML, e.g. --set num_envs=8 --set policies.archer.model.hidden=[32,32] "
        "(repeatable)",
    )
    common.add_argument(
        "--traceback",
        action="store_true",
        help="on error, also print the full Python traceback (default: a one-line message, "
        "plus the env's own traceback when the error came from inside the env)",
    )
    return common


def _import_from_cwd() -> None:
    """Like ``python -m``: import paths such as "examples.mappings:by_prefix" resolve
    against the directory the command runs in (a console script does not add it)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
