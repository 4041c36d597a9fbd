"""`marl-runner evaluate CHECKPOINT`: run whole episodes with a checkpoint's policies, no training.

Prints per policy the mean and standard deviation of its episode reward and
the mean episode length as a table, and with ``--out`` writes them (and every
episode's reward and length) as JSON. The checkpoint is restored under the
trust rules of ``marl_runner.restore_checkpoint``: import paths it names
(custom envs, mapping fns, callbacks, policy classes, models, connectors) are
refused unless ``--trusted`` or ``--allow PATH`` is given; registered and
built-in names (PettingZoo / MPE2 envs, TorchPolicy, built-in connectors) work
without. Exit codes as for ``sample``: 2 for a file or config that cannot be
used, 1 for a failure while running episodes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from connectors.imports import ImportPathError
from marl_runner.checkpoint.evaluation import (
    DEFAULT_MAX_EPISODE_STEPS,
    DEFAULT_MAX_FRAMES,
    EpisodeTooLong,
    EvaluationError,
    evaluate_checkpoint,
)
from marl_runner.cli.common import (
    EXIT_BAD_CONFIG,
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    describe,
    positive_int,
)
from marl_runner.cli.stopping import exit_code_of
from marl_runner.config import ConfigError

__all__ = ["add_evaluate_parser", "evaluation_table", "run_evaluate"]


def add_evaluate_parser(commands: Any) -> None:
    """Registers `evaluate` on the CLI's subparsers.

    It takes no ``common`` parent: that one's positional is a YAML config,
    this command's is a checkpoint file, so ``--set`` and ``--traceback`` are
    declared here with the same meaning.
    """
    evaluate = commands.add_parser(
        "evaluate",
        help="run whole episodes with a checkpoint's policies (no training) and print "
        "per-policy rewards",
        description="Restore a checkpoint (marl_runner.save_checkpoint, e.g. from "
        "examples/train_ppo.py), run --episodes complete episodes with its policies, "
        "observation filters frozen, and print per policy the mean and std of its episode "
        "reward and the mean episode length. Import paths named by the file are refused "
        "unless --trusted or --allow is given.",
    )
    evaluate.add_argument("checkpoint", type=Path, help="checkpoint file to evaluate")
    evaluate.add_argument(
        "--episodes",
        type=positive_int,
        default=10,
        metavar="N",
        help="complete episodes to run (default: 10)",
    )
    evaluate.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed for the envs and the action sampling (default: the checkpoint config's)",
    )
    evaluate.add_argument(
        "--max-episode-steps",
        type=positive_int,
        default=DEFAULT_MAX_EPISODE_STEPS,
        metavar="N",
        help="stop with an error when an episode runs N env steps without ending: the "
        f"checkpoint's env config decides episode lengths (default: {DEFAULT_MAX_EPISODE_STEPS:,})",
    )
    evaluate.add_argument(
        "--deterministic",
        action="store_true",
        help="take each policy's most likely action instead of sampling (explore: false)",
    )
    evaluate.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="also write the results as JSON to FILE (parent directories are made)",
    )
    evaluate.add_argument(
        "--render",
        type=Path,
        metavar="GIF",
        help="render the first episode (render_mode='rgb_array') and save it as an animated "
        f"GIF at this path, at most {DEFAULT_MAX_FRAMES} frames; needs Pillow and an env "
        "that renders rgb arrays",
    )
    evaluate.add_argument(
        "--fps", type=float, default=10.0, help="with --render: GIF frames per second (default: 10)"
    )
    evaluate.add_argument(
        "--trusted",
        action="store_true",
        help="trust the file: import whatever code its config and connector state name",
    )
    evaluate.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="import this path named by the file (repeatable); others are still refused",
    )
    evaluate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an entry of the checkpoint's config, as for sample, e.g. --set "
        "num_envs=4 --set env.config.max_cycles=100 (repeatable)",
    )
    evaluate.add_argument(
        "--traceback",
        action="store_true",
        help="on error, also print the full Python traceback (default: a one-line message, "
        "plus the env's own traceback when the error came from inside the env)",
    )


def run_evaluate(args: argparse.Namespace) -> int:
    """Evaluates ``args.checkpoint``, prints the table, writes ``--out``; returns the exit code."""
    from marl_runner.checkpoint import CheckpointError, ImportRefused  # imports torch

    if args.out is not None and args.out.is_dir():  # said now, not after every episode ran
        raise CommandError(f"--out {args.out}: is a directory; expected a file path (a .json)")
    # A file, config or env that cannot be used is exit 2; a failure while stepping is exit 1.
    try:
        evaluation = evaluate_checkpoint(
            args.checkpoint,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=args.deterministic,
            overrides=args.overrides,
            trusted=args.trusted,
            allow=args.allow,
            render_to=args.render,
            fps=args.fps,
            max_episode_steps=args.max_episode_steps,
        )
    except ImportRefused as exc:  # worded in flags, not in Python arguments
        raise CommandError(exc.cli_message(), EXIT_BAD_CONFIG) from exc
    except EpisodeTooLong as exc:
        raise CommandError(exc.cli_message(), EXIT_BAD_CONFIG) from exc
    except (CheckpointError, ConfigError, EvaluationError, ImportPathError) as exc:
        raise CommandError(str(exc), EXIT_BAD_CONFIG) from exc
    except KeyboardInterrupt as exc:
        raise CommandError("interrupted before the episodes were done", exit_code_of(exc)) from None
    except Exception as exc:
        raise CommandError(describe(exc), EXIT_FAILURE) from exc
    summary = evaluation.summary()
    console = Console()
    console.print(evaluation_table(summary))
    if args.render is not None:
        console.print(
            f"wrote {evaluation.frames} frames to {args.render}", highlight=False, soft_wrap=True
        )
    if args.out is not None:
        _write_json(args.out, summary)
        console.print(f"wrote {args.out}", highlight=False, soft_wrap=True)
    return EXIT_OK


def evaluation_table(summary: dict[str, Any]) -> Table:
    """Per policy: episodes, mean and std episode reward; then the episode as a whole."""
    title = f"evaluation of {summary['checkpoint']}"
    if summary["deterministic"]:
        title += " (deterministic)"
    table = Table(title=Text(title), show_header=True, header_style="bold")
    for name, justify in (
        ("policy", "left"),
        ("episodes", "right"),
        ("reward mean", "right"),
        ("reward std", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for policy_id, stats in summary["policies"].items():
        table.add_row(
            Text(policy_id),  # not markup: "[archer]" would vanish
            str(stats["episodes"]),
            _number(stats["reward_mean"]),
            _number(stats["reward_std"]),
        )
    table.add_section()
    table.add_row(
        "all agents",
        str(summary["episodes"]),
        _number(summary["episode_reward_mean"]),
        _number(summary["episode_reward_std"]),
    )
    caption = f"mean episode length {_number(summary['episode_len_mean'])}"
    if summary["seed"] is not None:
        caption += f", seed {summary['seed']}"
    if summary["faulty_episodes"]:
        caption += f", {summary['faulty_episodes']} faulty episodes not counted"
    table.caption = caption
    return table


def _write_json(path: Path, summary: dict[str, Any]) -> None:
    """NaN (no episodes for a policy) is written as null: JSON has no NaN."""
    clean = json.loads(json.dumps(summary), parse_constant=lambda _: None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(clean, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"--out {path}: cannot write there: {exc.strerror or exc}") from None


def _number(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"
