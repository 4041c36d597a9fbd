"""``marl-runner config-doc``: the config reference (docs/CONFIG.md) written from the schema."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from marl_runner.cli.common import EXIT_OK, CommandError
from marl_runner.config.reference import render

__all__ = ["add_config_doc_parser", "run_config_doc"]


def add_config_doc_parser(commands: Any) -> None:
    """Registers ``config-doc``."""
    doc = commands.add_parser(
        "config-doc",
        help="print the config reference (every key, its default and meaning) as Markdown",
        description="Print the config reference, generated from the config schema itself "
        "(docs/CONFIG.md is this output), or write it to --out.",
    )
    doc.add_argument("--out", type=Path, metavar="FILE", help="write it to FILE instead")
    doc.add_argument(
        "--traceback",
        action="store_true",
        help="on error, also print the full Python traceback (default: a one-line message)",
    )


def run_config_doc(args: argparse.Namespace) -> int:
    """Prints (or writes) the reference."""
    text = render()
    if args.out is None:
        print(text, end="")
        return EXIT_OK
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"--out {args.out}: cannot write there: {exc}") from exc
    print(f"wrote {args.out}")
    return EXIT_OK
