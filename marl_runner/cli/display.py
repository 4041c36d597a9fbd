"""What the CLI shows besides progress: the metrics table, the agents table, the run summary.

Progress itself (the live bar or plain lines, and ``SampleCounts``) is in
``marl_runner.progress``; its names are re-exported here for the commands
that import them from this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from marl_runner.progress import ProgressReporter, SampleCounts, make_progress

__all__ = [
    "ProgressReporter",
    "SampleCounts",
    "make_progress",
    "metrics_table",
    "print_run_summary",
    "spaces_table",
]

#: Says where the table's step counts and rates come from (see marl_runner.progress).
THROUGHPUT_NOTE = (
    "steps: those in the batches handed out; steps/s: over the {elapsed:.1f} s of sampling "
    "(runner build excluded), as in the progress line"
)


def metrics_table(metrics: Mapping[str, Any], counts: SampleCounts | None = None) -> Table:
    """The ``get_metrics()`` summary as a two-column table.

    With ``counts`` (what the progress display counted), the step counts and
    rates are those of the batches over the sampling time, the same numbers
    as the progress line; without, the metrics' own.
    """
    table = Table(title="sampling metrics", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")

    table.add_row("episodes", _format_int(metrics.get("episodes")))
    table.add_row("faulty episodes", _format_int(metrics.get("num_faulty_episodes")))
    if metrics.get("num_sub_env_restarts"):
        table.add_row("sub-env restarts", _format_int(metrics["num_sub_env_restarts"]))
    if metrics.get("num_late_rewards"):
        table.add_row("late rewards", _format_int(metrics["num_late_rewards"]))
    table.add_row("episode_reward_mean", _format_float(metrics.get("episode_reward_mean")))
    table.add_row("episode_len_mean", _format_float(metrics.get("episode_len_mean")))
    for policy_id, reward in sorted((metrics.get("policy_reward_mean") or {}).items()):
        # Text, not markup: "[archer]" would otherwise be read as a style tag and vanish.
        table.add_row(Text(f"policy_reward_mean[{policy_id}]"), _format_float(reward))
    for name, value in sorted((metrics.get("custom_metrics") or {}).items()):
        table.add_row(Text(f"custom_metrics[{name}]"), _format_float(value))
    table.add_section()
    if counts is None:
        steps = (metrics.get("num_env_steps"), metrics.get("num_agent_steps"))
        rates = (metrics.get("env_steps_per_s"), metrics.get("agent_steps_per_s"))
    else:
        steps = (counts.env_steps, counts.agent_steps)
        rates = (counts.env_steps_per_s(), counts.agent_steps_per_s())
        table.caption = THROUGHPUT_NOTE.format(elapsed=counts.elapsed_s)
    table.add_row("env steps", _format_int(steps[0]))
    table.add_row("agent steps", _format_int(steps[1]))
    table.add_row("env steps/s", _format_rate(rates[0]))
    table.add_row("agent steps/s", _format_rate(rates[1]))
    perf = metrics.get("perf") or {}
    if perf:
        table.add_section()
        for name, value in perf.items():
            table.add_row(f"perf {name}", _format_float(value))
    faults = metrics.get("faults") or []
    if faults:
        table.add_section()
        for fault in faults:  # why episodes were dropped, most recent last
            table.add_row("fault", Text(fault))
    return table


def print_run_summary(
    console: Console,
    metrics: Mapping[str, Any],
    counts: SampleCounts,
    *,
    out_dir: Path | None = None,
    metrics_log: Any = None,
    notes: Sequence[str] = (),
    interrupted: bool = False,
    title: str = "sampling metrics",
) -> None:
    """The end of a run, the same for every command: the metrics table, ``notes``, what was
    written to ``out_dir`` and to the metrics log, and whether it was interrupted; counted
    in words that agree with their numbers ("1 batch")."""
    table = metrics_table(metrics, counts)
    table.title = title
    console.print(table)
    lines = list(notes)
    if out_dir is not None:
        episodes = "" if counts.episodes is None else f"{counted(counts.episodes, 'episode')}, "
        lines.append(
            f"wrote {counted(counts.batches, 'batch', 'batches')} "
            f"({episodes}{counted(counts.env_steps, 'env step')}) to {out_dir}"
        )
    if metrics_log is not None:
        lines.append(
            f"wrote {counted(metrics_log.num_records, 'metrics record')} to {metrics_log.path}"
        )
    if interrupted:
        lines.append("interrupted: the metrics cover what was sampled so far")
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def counted(number: int, singular: str, plural: str | None = None) -> str:
    """``number`` and the noun that agrees with it: "1 batch", "2 batches"."""
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def spaces_table(rows: list[tuple[str, str, str, str]]) -> Table:
    """``(agent, policy, observation space, action space)`` rows, for ``marl-runner validate``."""
    table = Table(title="agents -> policies", show_header=True, header_style="bold")
    for name in ("agent", "policy", "observation space", "action space"):
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # ids and space reprs are not markup
    return table


def _format_int(value: Any) -> str:
    return "n/a" if value is None else f"{int(value):,}"


def _format_float(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):.3f}"


def _format_rate(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):,.0f}"
