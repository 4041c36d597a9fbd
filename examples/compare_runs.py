"""Learning curves of several train_ppo.py / train_mappo.py runs on one plot, one colour per
label (e.g. IPPO vs MAPPO, a line per seed), and a table of their summaries.

    python examples/compare_runs.py --out docs/img/mappo_vs_ippo_simple_spread.png \\
        IPPO=runs/ippo-seed1,runs/ippo-seed2 MAPPO=runs/mappo-seed1,runs/mappo-seed2

Each run dir needs ``progress.csv`` and ``summary.json``. The curves are the training-time
``episode_reward_mean`` smoothed over ``--smooth`` iterations; the dashed line is the mean
of the runs' random-policy evaluations.
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
            for name in ("progress.csv", "summary.json"):
                if not (run / name).is_file():
                    parser.error(f"{item!r}: {run / name} does not exist")
        groups[label] = runs
    return groups


def read_summary(run: Path) -> dict[str, Any]:
    """The run's summary.json, as train_ppo.py / train_mappo.py wrote it."""
    return json.loads((run / "summary.json").read_text())


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` finite values (NaN iterations skipped)."""
    out = np.full(len(values), math.nan)
    finite = np.flatnonzero(np.isfinite(values))
    for i, index in enumerate(finite):
        out[index] = values[finite[max(0, i - window + 1) : i + 1]].mean()
    return out


def draw(groups: dict[str, list[Path]], out: Path, window: int, title: str) -> None:
    """The runs' smoothed curves, a colour per label, and their mean random-policy level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    randoms = []
    for colour, (label, runs) in enumerate(groups.items()):
        for seed_index, run in enumerate(runs):
            rows = read_progress_csv(run / "progress.csv")
            steps = np.array([row["env_steps"] for row in rows])
            rewards = np.array([row["episode_reward_mean"] for row in rows])
            axes.plot(
                steps, smoothed(rewards, window), color=f"C{colour}", alpha=0.85,
                label=label if seed_index == 0 else None,
            )  # fmt: skip
            randoms.append(read_summary(run)["random_episode_reward_mean"])
    level = float(np.mean(randoms))
    axes.axhline(level, linestyle="--", color="gray", label=f"random policy ({level:.1f})")
    axes.set_xlabel("env_steps")
    axes.set_ylabel(f"episode_reward_mean (mean of {window} iterations)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def summaries(groups: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """One row per run: its label, seed dir and summary.json numbers."""
    table = []
    for label, runs in groups.items():
        for run in runs:
            table.append({"label": label, "run": run.name, **read_summary(run)})
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
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth {args.smooth}: expected an int >= 1")
    groups = parse_groups(args.groups, parser)
    draw(groups, args.out, args.smooth, args.title)
    table = summaries(groups)
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
