"""Learning curves of several train_ppo.py / train_mappo.py runs on one plot, one colour per
label (e.g. IPPO vs MAPPO, a line per seed), and a table of their summaries.

    python examples/compare_runs.py --out docs/img/mappo_vs_ippo_simple_spread.png \\
        IPPO=runs/ippo-seed1,runs/ippo-seed2 MAPPO=runs/mappo-seed1,runs/mappo-seed2

Each run dir needs ``progress.csv``; ``summary.json`` (written when a run ends) adds the
run to the table and its random-policy evaluation to the dashed line (their mean). The
curves are a progress column (``--column``, default the training-time
``episode_reward_mean``) smoothed over ``--smooth`` iterations; ``--hline LABEL=VALUE``
adds reference lines (a scripted controller's level, say), and a run still training is
drawn as far as it got:

    python examples/compare_runs.py --out docs/img/spread_long.png --hline "scripted=-24.8" \
        MAPPO=runs/spread-mappo-s1,runs/spread-mappo-s2
    python examples/compare_runs.py --out docs/img/c4.png --column vs_bot_win --smooth 1 \
        league=runs/league-bot-s1,runs/league-bot-s2
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from marl_runner.metrics_log import read_progress_csv


def parse_groups(items: list[str], parser: argparse.ArgumentParser) -> dict[str, list[Path]]:
    """``LABEL=DIR,DIR`` items -> ``{label: [run dirs]}``; ``parser.error`` on a bad item."""
    groups: dict[str, list[Path]] = {}
    for item in items:
        label, sep, dirs = item.partition("=")
        if not sep or not label or not dirs:
            parser.error(f"{item!r}: expected LABEL=RUN_DIR[,RUN_DIR...]")
        runs = [Path(d) for d in dirs.split(",")]
        for run in runs:
            if not (run / "progress.csv").is_file():
                parser.error(f"{item!r}: {run / 'progress.csv'} does not exist")
        groups[label] = runs
    return groups


def read_summary(run: Path) -> dict[str, Any] | None:
    """The run's summary.json, as train_ppo.py / train_mappo.py wrote it; None while the run
    has not ended."""
    path = run / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def parse_hlines(items: list[str], parser: argparse.ArgumentParser) -> dict[str, float]:
    """``LABEL=VALUE`` items -> ``{label: value}``; ``parser.error`` on a bad item."""
    lines = {}
    for item in items:
        label, sep, value = item.rpartition("=")
        try:
            lines[label] = float(value)
        except ValueError:
            sep = ""
        if not sep or not label:
            parser.error(f"--hline {item!r}: expected LABEL=NUMBER")
    return lines


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` finite values (NaN iterations skipped)."""
    out = np.full(len(values), math.nan)
    finite = np.flatnonzero(np.isfinite(values))
    for i, index in enumerate(finite):
        out[index] = values[finite[max(0, i - window + 1) : i + 1]].mean()
    return out


def draw(
    groups: dict[str, list[Path]],
    out: Path,
    window: int,
    title: str,
    column: str = "episode_reward_mean",
    hlines: dict[str, float] | None = None,
) -> None:
    """The runs' smoothed ``column`` curves, a colour per label, their mean random-policy
    level (runs with a summary) and ``hlines`` (label -> level) as dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    randoms = []
    for colour, (label, runs) in enumerate(groups.items()):
        for seed_index, run in enumerate(runs):
            rows = read_progress_csv(run / "progress.csv")
            steps = np.array([row["env_steps"] for row in rows])
            curve = smoothed(np.array([row[column] for row in rows]), window)
            measured = np.isfinite(curve)  # a column measured every few iterations: join them
            axes.plot(
                steps[measured], curve[measured], color=f"C{colour}", alpha=0.85,
                label=label if seed_index == 0 else None,
            )  # fmt: skip
            summary = read_summary(run)
            if summary is not None and "random_episode_reward_mean" in summary:
                randoms.append(summary["random_episode_reward_mean"])
    if randoms:
        level = float(np.mean(randoms))
        axes.axhline(level, linestyle="--", color="gray", label=f"random policy ({level:.1f})")
    for index, (label, level) in enumerate((hlines or {}).items()):
        axes.axhline(
            level, linestyle=":", color=f"C{len(groups) + index}", label=f"{label} ({level:g})"
        )
    axes.set_xlabel("env_steps")
    axes.set_ylabel(f"{column} (mean of {window} iterations)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def summaries(groups: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """One row per run that has ended: its label, seed dir and summary.json numbers."""
    table = []
    for label, runs in groups.items():
        for run in runs:
            summary = read_summary(run)
            if summary is not None:
                table.append({"label": label, "run": run.name, **summary})
    return table


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "groups",
        nargs="+",
        metavar="LABEL=RUN_DIR[,RUN_DIR...]",
        help="a label (a colour in the plot) and its run dirs (a line each, e.g. one per seed)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument(
        "--smooth", type=int, default=10, help="iterations per plotted mean (default: 10)"
    )
    parser.add_argument(
        "--title",
        default="mean episode reward (all agents summed)",
        help="the plot's title (default: %(default)s)",
    )
    parser.add_argument(
        "--column",
        default="episode_reward_mean",
        help="the progress.csv column to draw (default: %(default)s)",
    )
    parser.add_argument(
        "--hline",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="a reference level to draw, e.g. a scripted controller's (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth {args.smooth}: expected an int >= 1")
    groups = parse_groups(args.groups, parser)
    hlines = parse_hlines(args.hline, parser)
    draw(groups, args.out, args.smooth, args.title, args.column, hlines)
    table = [row for row in summaries(groups) if "trained_episode_reward_mean" in row]
    for row in table:
        print(
            f"{row['label']:>8} {row['run']:>14}: random {row['random_episode_reward_mean']:7.2f}  "
            f"trained {row['trained_episode_reward_mean']:7.2f}  env_steps {row['env_steps']}  "
            f"train_wall_s {row['train_wall_s']}  sps {row['sps']}"
        )
    print(f"wrote {args.out}")
    return table


if __name__ == "__main__":
    main()
