"""Sampling progress: the counts of what was sampled, and the bar (or lines) showing them.

The CLI's ``sample`` and ``serve`` and Python loops (``sample_with_progress``)
show progress the same way. In a terminal it is a rich live bar; anywhere
else (CI logs, files, pipes) a bar would either print nothing until the end
or flood the log with redraws, so a plain line is printed every few seconds
instead.

Throughput is counted one way everywhere: steps in the batches handed out,
divided by the sampling time, which starts when the progress display starts
(after the runner is built) and ends at the last batch counted. The progress
line and the CLI's final table both read it from ``SampleCounts``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
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

__all__ = [
    "UNIT_LABELS",
    "ProgressReporter",
    "SampleCounts",
    "count_batch",
    "count_batches",
    "make_progress",
    "sample_with_progress",
]

UNIT_LABELS = {"env_steps": "env steps", "agent_steps": "agent steps", "episodes": "episodes"}


@dataclass
class SampleCounts:
    """What sampling has handed out so far, and over how long.

    ``env_steps`` and ``agent_steps`` are those of the batches
    (``batch.env_steps()``, ``batch.agent_steps()``); ``elapsed_s`` is the
    sampling time up to the last count (set by ``ProgressReporter.update``).
    ``episodes`` is None where it is not known (a plain ``EnvRunner``, whose
    episode counts belong to its caller's ``get_metrics()``).
    """

    env_steps: int = 0
    agent_steps: int = 0
    episodes: int | None = 0
    faulty_episodes: int = 0
    batches: int = 0
    elapsed_s: float = 0.0

    def env_steps_per_s(self) -> float:
        """Env steps in the batches per second of sampling."""
        return self.env_steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def agent_steps_per_s(self) -> float:
        """Agent steps (transitions) in the batches per second of sampling."""
        return self.agent_steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def add(self, batch: Any) -> None:
        """Counts one batch handed out."""
        self.batches += 1
        self.env_steps += batch.env_steps()
        self.agent_steps += batch.agent_steps()


class ProgressReporter:
    """Shows progress towards ``target`` of ``unit`` (a ``SampleCounts`` field); a context manager.

    Its clock is the sampling clock: it starts on ``__enter__`` and each
    ``update`` stores the time so far in ``counts.elapsed_s``.
    """

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
        """Stamps ``counts.elapsed_s`` with the sampling time so far, then shows the counts."""
        counts.elapsed_s = time.perf_counter() - self.started
        self._show(counts)

    def _show(self, counts: SampleCounts) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define how counts are shown")


class _LiveBar(ProgressReporter):
    """A rich progress bar redrawn in place."""

    def __enter__(self) -> _LiveBar:
        super().__enter__()
        # Kept under 80 columns: rich truncates every column of a line that is too wide.
        self._progress = Progress(
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn(UNIT_LABELS[self.unit]),
            TextColumn("• {task.fields[episodes]}{task.fields[rate]:,.0f} env steps/s •"),
            TimeRemainingColumn(compact=True, elapsed_when_finished=True),
            console=self.console,
        )
        self._progress.__enter__()
        self._task = self._progress.add_task(
            "sampling", total=self.target, episodes="", rate=0.0
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def _show(self, counts: SampleCounts) -> None:
        self._progress.update(
            self._task,
            completed=min(_done(counts, self.unit), self.target),
            episodes=_episodes(counts, " • "),
            rate=counts.env_steps_per_s(),
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

    def _show(self, counts: SampleCounts) -> None:
        self._counts = counts
        if time.perf_counter() - self._last_print >= self.interval_s:
            self._print(counts)

    def _print(self, counts: SampleCounts) -> None:
        done = _done(counts, self.unit)
        line = (
            f"sampling: {done}/{self.target} {UNIT_LABELS[self.unit]} "
            f"({100.0 * min(done, self.target) / self.target:.0f}%), "
            f"{_episodes(counts, ', ')}{counts.env_steps_per_s():,.0f} env steps/s, "
            f"{counts.agent_steps_per_s():,.0f} agent steps/s, "
            f"{counts.elapsed_s:.1f}s elapsed"
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


def count_batches(
    batches: Iterator[Any],
    counts: SampleCounts,
    unit: str,
    target: int,
    progress: ProgressReporter,
    totals: Any = None,
    stopped: Callable[[], bool] = lambda: False,
) -> Iterator[Any]:
    """Yields batches from ``batches`` until ``counts.<unit>`` reaches ``target`` or
    ``stopped()`` is true.

    A batch is counted (and the display updated) when the caller's loop body
    for it has finished, so a batch the caller failed to write is not
    counted. ``totals`` (an ``EnvRunnerGroup``'s) supplies the episode counts.
    """
    while _done(counts, unit) < target and not stopped():
        batch = next(batches)
        if stopped() and not batch.agent_steps():
            return  # the stopped sample() handed out nothing: no batch
        yield batch
        count_batch(batch, counts, progress, totals)


def count_batch(batch: Any, counts: SampleCounts, progress: ProgressReporter, totals: Any = None) -> None:
    """Counts a batch handed out (``totals``: the group's episode counts) and shows it."""
    counts.add(batch)
    if totals is not None:
        counts.episodes = totals.episodes
        counts.faulty_episodes = totals.faulty_episodes
    progress.update(counts)


def sample_with_progress(
    runner: Any,
    num_env_steps: int | None = None,
    *,
    num_agent_steps: int | None = None,
    console: Console | None = None,
    interval_s: float = 10.0,
) -> Any:
    """``runner.sample()`` until the batches hold ``num_env_steps`` (or ``num_agent_steps``),
    with the CLI's progress bar; returns them as one ``MultiAgentBatch``.

    For long sampling loops in Python: ``runner`` is an ``EnvRunner`` or an
    ``EnvRunnerGroup``; each ``sample()`` call is one fragment per sub-env, so
    the result holds at least the steps asked for. Episodes are shown for a
    group only (an ``EnvRunner`` leaves its episode counts to the caller's
    ``get_metrics()``). Without a terminal, a line every ``interval_s`` seconds.
    Example::

        from marl_runner.progress import sample_with_progress

        with EnvRunner(config) as runner:
            batch = sample_with_progress(runner, 100_000)
    """
    if (num_env_steps is None) == (num_agent_steps is None):
        raise ValueError(
            "sample_with_progress: give exactly one of num_env_steps and num_agent_steps, got "
            f"num_env_steps={num_env_steps!r}, num_agent_steps={num_agent_steps!r}"
        )
    unit, target = (
        ("env_steps", num_env_steps) if num_env_steps is not None else ("agent_steps", num_agent_steps)
    )
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise ValueError(f"sample_with_progress: {unit} must be an integer >= 1, got {target!r}")
    from marl_runner.batch import concat_samples

    totals = getattr(runner, "totals", None)
    counts = SampleCounts(episodes=None if totals is None else 0)
    progress = make_progress(target, unit, console or Console(), interval_s=interval_s)
    batches = iter(runner.sample, None)
    with progress:
        collected = list(count_batches(batches, counts, unit, target, progress, totals))
    return concat_samples(collected)


def _done(counts: SampleCounts, unit: str) -> int:
    return getattr(counts, unit) or 0


def _episodes(counts: SampleCounts, separator: str) -> str:
    """Episode count (faulty ones shown, so an env failing every episode is noticed), if known."""
    if counts.episodes is None:
        return ""
    text = f"{counts.episodes} episodes"
    if counts.faulty_episodes:
        text += f" ({counts.faulty_episodes} faulty)"
    return text + separator
