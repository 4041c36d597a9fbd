"""What the CLI shows: live sampling progress and the final metrics table.

In a terminal, progress is a rich live bar. Anywhere else (CI logs, files,
pipes) a bar would either print nothing until the end or flood the log with
redraws, so a plain line is printed every few seconds instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

__all__ = ["ProgressReporter", "SampleCounts", "make_progress", "metrics_table", "spaces_table"]

UNIT_LABELS = {"env_steps": "env steps", "agent_steps": "agent steps", "episodes": "episodes"}


@dataclass
class SampleCounts:
    """What the sampling loop has produced so far, as counted from ``runner.step()`` outputs."""

    env_steps: int = 0
    agent_steps: int = 0
    episodes: int = 0
    faulty_episodes: int = 0
    batches: int = 0


class ProgressReporter:
    """Shows progress towards ``target`` of ``unit`` (a ``SampleCounts`` field); a context manager."""

    def __init__(self, target: int, unit: str, console: Console) -> None:
        if unit not in UNIT_LABELS:
            raise ValueError(f"unknown progress unit {unit!r}; expected one of {list(UNIT_LABELS)}")
        self.target = target
        self.unit = unit
        self.console = console
        self.started = time.perf_counter()

    def __enter__(self) -> ProgressReporter:
        self.started = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def update(self, counts: SampleCounts) -> None:
        raise NotImplementedError

    def env_steps_per_s(self, counts: SampleCounts) -> float:
        return counts.env_steps / max(time.perf_counter() - self.started, 1e-9)


class _LiveBar(ProgressReporter):
    """A rich progress bar redrawn in place."""

    def __enter__(self) -> _LiveBar:
        super().__enter__()
        # Kept under 80 columns: rich truncates every column of a line that is too wide.
        self._progress = Progress(
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn(UNIT_LABELS[self.unit]),
            TextColumn("• {task.fields[episodes]} • {task.fields[rate]:,.0f} env steps/s •"),
            TimeRemainingColumn(compact=True, elapsed_when_finished=True),
            console=self.console,
        )
        self._progress.__enter__()
        self._task = self._progress.add_task(
            "sampling", total=self.target, episodes=_episodes(SampleCounts()), rate=0.0
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def update(self, counts: SampleCounts) -> None:
        self._progress.update(
            self._task,
            completed=min(getattr(counts, self.unit), self.target),
            episodes=_episodes(counts),
            rate=self.env_steps_per_s(counts),
        )


class _PlainLines(ProgressReporter):
    """One line every ``interval_s`` seconds, and a last one when done."""

    def __init__(self, target: int, unit: str, console: Console, interval_s: float) -> None:
        super().__init__(target, unit, console)
        self.interval_s = interval_s
        self._last_print = -math.inf
        self._counts: SampleCounts | None = None
        self._printed: SampleCounts | None = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._counts is not None and self._counts != self._printed:
            self._print(self._counts)

    def update(self, counts: SampleCounts) -> None:
        self._counts = counts
        if time.perf_counter() - self._last_print >= self.interval_s:
            self._print(counts)

    def _print(self, counts: SampleCounts) -> None:
        done = getattr(counts, self.unit)
        elapsed = time.perf_counter() - self.started
        line = (
            f"sampling: {done}/{self.target} {UNIT_LABELS[self.unit]} "
            f"({100.0 * min(done, self.target) / self.target:.0f}%), "
            f"{_episodes(counts)}, {self.env_steps_per_s(counts):,.0f} env steps/s, "
            f"{elapsed:.1f}s elapsed"
        )
        self.console.file.write(line + "\n")
        self.console.file.flush()
        self._last_print = time.perf_counter()
        self._printed = SampleCounts(**vars(counts))  # the caller keeps mutating `counts`


def make_progress(
    target: int, unit: str, console: Console, *, interval_s: float = 10.0
) -> ProgressReporter:
    """A live bar when ``console`` is a terminal, else plain lines every ``interval_s`` seconds."""
    if console.is_terminal:
        return _LiveBar(target, unit, console)
    return _PlainLines(target, unit, console, interval_s)


def metrics_table(metrics: Mapping[str, Any]) -> Table:
    """The ``runner.get_metrics()`` summary as a two-column table."""
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
    table.add_row("env steps", _format_int(metrics.get("num_env_steps")))
    table.add_row("agent steps", _format_int(metrics.get("num_agent_steps")))
    table.add_row("env steps/s", _format_rate(metrics.get("env_steps_per_s")))
    table.add_row("agent steps/s", _format_rate(metrics.get("agent_steps_per_s")))
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


def spaces_table(rows: list[tuple[str, str, str, str]]) -> Table:
    """``(agent, policy, observation space, action space)`` rows, for ``marl-runner validate``."""
    table = Table(title="agents -> policies", show_header=True, header_style="bold")
    for name in ("agent", "policy", "observation space", "action space"):
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # ids and space reprs are not markup
    return table


def _episodes(counts: SampleCounts) -> str:
    """Episode count; faulty ones are shown so that an env failing every episode is noticed."""
    text = f"{counts.episodes} episodes"
    return f"{text} ({counts.faulty_episodes} faulty)" if counts.faulty_episodes else text


def _format_int(value: Any) -> str:
    return "n/a" if value is None else f"{int(value):,}"


def _format_float(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):.3f}"


def _format_rate(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):,.0f}"
