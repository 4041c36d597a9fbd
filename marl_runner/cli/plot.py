"""`marl-runner plot RUN`: a learning curve from a metrics log or a training run's progress.csv.

RUN is a JSON-lines metrics log (`sample --metrics-out`, `MetricsLogWriter`),
a `progress.csv` (`examples/train_ppo.py`), or a directory holding
`metrics.jsonl` and/or `progress.csv`. Nested values of a metrics record
(`policy_reward_mean`, `custom_metrics`, `perf`) are columns named
`key/sub_key`; naming the key alone draws all of them.

A run without training (a `sample` log: its policies keep their initial
weights) is drawn with a note saying so, since its reward curve is the
spread of a fixed policy's returns, not learning.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marl_runner.cli.common import EXIT_FAILURE, EXIT_OK, CommandError
from marl_runner.metrics_log import plot_learning_curve, read_metrics_log, read_progress_csv

#: What a directory is searched for, in this order (the first one found is drawn).
RUN_FILES = ("metrics.jsonl", "progress.csv")


#: Columns (or their last `/` part, e.g. `archer/policy_loss`) that only a training run records.
TRAINING_COLUMNS = (
    "iteration",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "lr",
    "train_s",
)


def add_plot_parser(commands: Any) -> None:
    """Registers `plot` on the CLI's subparsers."""
    plot = commands.add_parser(
        "plot",
        help="draw a learning curve (PNG) from a metrics log or a training run's progress.csv",
        description="Draw columns of a metrics log (sample --metrics-out) or of a progress.csv "
        "(examples/train_ppo.py) over steps or time into a PNG. Nested metrics are columns "
        "named key/sub_key, e.g. policy_reward_mean/archer; naming the key alone draws them all.",
    )
    plot.add_argument(
        "run",
        type=Path,
        metavar="RUN_DIR_OR_FILE",
        help="a .jsonl metrics log, a .csv progress file, or a directory holding "
        f"{' or '.join(RUN_FILES)} (the first one found, in that order)",
    )
    plot.add_argument(
        "--out",
        type=Path,
        metavar="PNG",
        help="where to write the PNG (default: next to the file drawn, named after it with "
        ".png, e.g. metrics.png)",
    )
    plot.add_argument(
        "--x",
        default="env_steps",
        metavar="COLUMN",
        help="the x axis: env_steps (default), agent_steps, elapsed_s (metrics logs) or any "
        "other numeric column",
    )
    plot.add_argument(
        "--y",
        nargs="+",
        default=["episode_reward_mean"],
        metavar="COLUMN",
        help="one or more columns to draw (default: episode_reward_mean)",
    )
    plot.add_argument("--title", help="the plot's title (default: the columns drawn over x)")
    plot.add_argument(
        "--traceback",
        action="store_true",
        help="on error, also print the full Python traceback (default: a one-line message)",
    )


def run_plot(args: argparse.Namespace) -> int:
    """The `plot` command: reads the run, checks the columns, writes the PNG."""
    source = find_run_file(args.run)
    rows = read_rows(source)
    columns = numeric_columns(rows)
    if args.x not in columns:
        raise CommandError(f"--x {args.x}: {_not_drawable(args.x, rows, source)}; {_available(columns)}")
    y_columns = resolve_columns(args.y, columns, source, rows)
    out = args.out if args.out is not None else source.with_suffix(".png")
    if out.is_dir():
        raise CommandError(f"--out {out}: is a directory; expected a file path (a .png, .svg ...)")
    trained = has_training(columns)
    title = args.title
    if title is None and not trained:
        title = f"{', '.join(y_columns)} over {args.x} (no training: sampling only)"
    try:
        out = plot_learning_curve(rows, out, x=args.x, y=y_columns, title=title)
    except ImportError as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from exc
    except ValueError as exc:
        raise CommandError(f"{source}: {exc}") from exc
    except OSError as exc:
        raise CommandError(f"--out {out}: cannot write there: {exc}") from exc
    if not trained:
        print(
            f"note: {source} records no training (none of the columns "
            f"{', '.join(TRAINING_COLUMNS)}): a sampling run's policies keep their weights, so "
            "the curve shows how a fixed policy's results vary, not learning"
        )
    print(f"wrote {out} ({', '.join(y_columns)} over {args.x}, {len(rows)} rows of {source})")
    return EXIT_OK


def has_training(columns: Sequence[str]) -> bool:
    """Whether the run's columns include any a training run writes (losses, learning rate)."""
    return any(column.rpartition("/")[2] in TRAINING_COLUMNS for column in columns)


def find_run_file(run: Path) -> Path:
    """The file to draw: `run` itself, or the first of RUN_FILES in the directory `run`."""
    if run.is_dir():
        for name in RUN_FILES:
            if (run / name).is_file():
                return run / name
        raise CommandError(f"{run}: holds neither {' nor '.join(RUN_FILES)}")
    if not run.exists():
        raise CommandError(f"{run}: no such file or directory")
    return run


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a progress.csv (by its `.csv` suffix) or of a JSON-lines metrics log,
    nested values flattened to `key/sub_key` columns."""
    try:
        if path.suffix == ".csv":
            rows: list[dict[str, Any]] = list(read_progress_csv(path))
        else:
            rows = [flatten(record) for record in read_metrics_log(path)]
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{path}: cannot read it: {exc}") from exc
    except ValueError as exc:  # a broken record, or a CSV cell that is not a number
        raise CommandError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from exc
    if not rows:
        raise CommandError(f"{path}: holds no records yet")
    return rows


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a/b": 1}`, the way TensorBoard tags name nested metrics."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def numeric_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Columns whose every value is a number or missing (JSON null, an empty CSV cell),
    in the order first seen; lists and texts such as `faults` are not columns to draw."""
    columns: dict[str, bool] = {}
    for row in rows:
        for key, value in row.items():
            numeric = value is None or (
                isinstance(value, int | float) and not isinstance(value, bool)
            )
            columns[key] = columns.get(key, True) and numeric
    return [key for key, numeric in columns.items() if numeric]


def resolve_columns(
    names: Sequence[str], columns: Sequence[str], source: Path, rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """`--y` names as columns: a name that is a nested key stands for all its sub-keys."""
    resolved: list[str] = []
    for name in names:
        if name in columns:
            resolved.append(name)
            continue
        members = [column for column in columns if column.startswith(f"{name}/")]
        if not members:
            raise CommandError(
                f"--y {name}: {_not_drawable(name, rows, source)}; {_available(columns)}"
            )
        resolved.extend(members)
    return list(dict.fromkeys(resolved))


def _not_drawable(name: str, rows: Sequence[Mapping[str, Any]], source: Path) -> str:
    """Why column ``name`` cannot be drawn: it is not there, or not all numbers."""
    if any(name in row for row in rows):
        return f"column of {source} holds values that are not numbers"
    return f"no such column in {source}"


def _available(columns: Sequence[str]) -> str:
    return f"available: {', '.join(columns)}" if columns else "it has no numeric columns"
