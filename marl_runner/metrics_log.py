"""Run logs: metrics as JSON lines while sampling, read back, and drawn as a learning curve.

A record is one reporting interval: the dict ``get_metrics()`` returned
(counts since the previous call), plus ``time``, ``elapsed_s`` and the
cumulative ``env_steps`` / ``agent_steps`` so far, so a curve can be drawn
over steps without summing. Non-finite floats are written as ``null`` (JSON
has no NaN). ``RunMetrics`` logs a runner's or group's intervals and adds them
up for the end-of-run summary. Plotting imports matplotlib only when called,
so sampling never needs it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from marl_runner.metrics_merge import DictMeans, merge_metrics
from marl_runner.safe_files import read_regular_file

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_LOG_BYTES",
    "MAX_LOG_VALUES",
    "MAX_RECORD_DEPTH",
    "MetricsLogWriter",
    "RunMetrics",
    "plot_learning_curve",
    "read_metrics_log",
    "read_progress_csv",
]

#: Keys of a group's ``get_metrics()`` that are a state at the time of the call, not
#: counts over the interval: a whole-run summary keeps the latest, never the sum.
_STATE_KEYS = ("num_healthy_runners", "num_runner_restarts")
#: Lists of messages about the interval: a whole-run summary keeps the last few of all.
_MESSAGE_KEYS = ("faults", "runner_faults")
MAX_SUMMARY_MESSAGES = 10
#: What ``plot`` reads back of a metrics log or progress.csv: the records and their
#: flattened rows take ~10x the file's bytes, and up to ~25x for crafted files of tiny
#: records or keys, so the file, its lines and its values are bounded before they are
#: held (a symlink to /dev/zero, a FIFO or a file of newlines is refused, not read).
#: 32 MiB is about 39,000 records of a two-policy run (108 hours at one per 10 s).
MAX_LOG_BYTES = 32 << 20
#: The longest line: a record of a two-policy run is about 900 characters.
MAX_LINE_CHARS = 1 << 20
#: Lines, numbers, texts, lists and objects in all (CSV: cells and rows); a record of a
#: two-policy run holds about 40.
MAX_LOG_VALUES = 3_000_000
#: Levels of nesting a record may have: a runner's are 3 deep (perf/policy/key).
MAX_RECORD_DEPTH = 32
#: The key ``csv.DictReader`` gives the cells past the header's.
_EXTRA_CELLS = "\0extra"


class MetricsLogWriter:
    """Appends one JSON line per reporting interval to ``path`` (created or replaced).

    ``interval_s`` paces :meth:`maybe_write`: a record at most that often
    (0 = every call). Each line is flushed, so a crashed or interrupted run
    keeps every record written before it.
    """

    def __init__(self, path: str | os.PathLike[str], interval_s: float = 10.0) -> None:
        if interval_s < 0:
            raise ValueError(f"metrics log interval_s must be >= 0, got {interval_s}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.interval_s = float(interval_s)
        self.env_steps = 0
        self.agent_steps = 0
        self.num_records = 0
        self._start = time.monotonic()
        self._last_write = self._start
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")

    def write(self, metrics: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
        """Writes ``metrics`` (one ``get_metrics()`` result) and ``fields`` as one line.

        Returns the record as written (after JSON conversion).
        """
        if self._file is None:
            raise ValueError(f"metrics log {self.path} is closed")
        self.env_steps += int(metrics.get("num_env_steps", 0))
        self.agent_steps += int(metrics.get("num_agent_steps", 0))
        now = time.monotonic()
        record = _jsonable(
            {
                "time": time.time(),
                "elapsed_s": now - self._start,
                "env_steps": self.env_steps,
                "agent_steps": self.agent_steps,
                **dict(sorted(metrics.items())),
                **fields,
            }
        )
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self.num_records += 1
        self._last_write = now
        return record

    def maybe_write(self, get_metrics: Callable[[], Mapping[str, Any]], **fields: Any) -> bool:
        """Writes ``get_metrics()`` if ``interval_s`` passed since the last record.

        ``get_metrics`` is called only then, since a runner's ``get_metrics``
        resets its counters. Returns whether a record was written.
        """
        if time.monotonic() - self._last_write < self.interval_s:
            return False
        self.write(get_metrics(), **fields)
        return True

    def close(self) -> None:
        """Puts every record on disk; later writes raise, and closing again does nothing."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsLogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RunMetrics:
    """A runner's or group's metrics over a whole run, also logged once per interval.

    ``get_metrics()`` resets its source's counters, so what logs the intervals
    must also add them up for the end-of-run summary. :meth:`poll` (call it
    after each batch) reads the source into ``log`` when its interval has
    passed; :meth:`finish` reads the rest, logs it, and returns the summary
    of every interval. Without a log the source is read once, at the end.
    """

    def __init__(
        self, get_metrics: Callable[[], Mapping[str, Any]], log: MetricsLogWriter | None = None
    ) -> None:
        self._get_metrics = get_metrics
        self.log = log
        # The intervals read so far, folded into one as each is read, so a run of any
        # length holds one dict (a server logging every minute for months included).
        self._summary: dict[str, Any] | None = None
        # The perf times' mean over the intervals (not a merge of merges: a plain mean).
        self._perf_means = DictMeans()
        self._unlogged: list[dict[str, Any]] = []
        self._start = self._logged_at = time.perf_counter()

    def poll(self, **fields: Any) -> bool:
        """Logs a record if the log's interval has passed; returns whether it did."""
        if self.log is None or not self.log.maybe_write(self._read, **fields):
            return False
        self._unlogged.clear()
        self._logged_at = time.perf_counter()
        return True

    def finish(self, **fields: Any) -> dict[str, Any]:
        """Reads what is left into a last record and returns the whole run's metrics.

        The last record also holds anything read but not logged (a Ctrl-C
        between the two), and is left out when nothing happened since the
        previous record, so a run's records never end with an empty duplicate.
        """
        self._read()
        if self.log is not None:
            unlogged = self._unlogged
            last = unlogged[0] if len(unlogged) == 1 else self._merge(unlogged, self._logged_at)
            if _has_activity(last) or not self.log.num_records:
                self.log.write(last, **fields)
            self._unlogged.clear()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """The metrics of every interval read so far, merged as a group merges its runners'."""
        return self._merge([], self._start) if self._summary is None else dict(self._summary)

    @staticmethod
    def _merge(parts: list[dict[str, Any]], since: float) -> dict[str, Any]:
        """``parts`` as one interval that began at ``since`` (``perf_counter`` time)."""
        merged = merge_metrics(parts, time.perf_counter() - since)
        for key in _STATE_KEYS:
            if parts and key in parts[-1]:
                merged[key] = parts[-1][key]
        for key in _MESSAGE_KEYS:
            if key in merged:
                messages = [m for part in parts for m in part.get(key) or []]
                merged[key] = messages[-MAX_SUMMARY_MESSAGES:]
        return merged

    def _read(self) -> dict[str, Any]:
        metrics = dict(self._get_metrics())
        self._fold(metrics)
        self._unlogged.append(metrics)
        return metrics

    def _fold(self, metrics: dict[str, Any]) -> None:
        """Adds one interval to the summary: the same merge as of every interval at once
        (counts, episode-weighted means, min/max, the latest state, the last messages),
        with the perf times' mean kept exact by their sums and counts."""
        self._perf_means.add(metrics.get("perf"))
        if self._summary is None:
            self._summary = dict(metrics)
            return
        merged = self._merge([self._summary, metrics], self._start)
        if "perf" in merged:
            merged["perf"] = self._perf_means.means()
        self._summary = merged


def _has_activity(metrics: Mapping[str, Any]) -> bool:
    return any(
        metrics.get(key)
        for key in ("num_env_steps", "num_agent_steps", "episodes", "num_faulty_episodes")
    )


def _jsonable(value: Any) -> Any:
    """Numpy scalars/arrays -> Python, non-finite floats -> None, keys -> str."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def read_metrics_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a JSON-lines metrics log; a torn last line (crash mid-write) is skipped.

    Raises:
        OSError: the file cannot be opened.
        ValueError: not a regular file (``FileRefused``), past one of the bounds (``MAX_LOG_*``),
            or a line that is no JSON object nested at most ``MAX_RECORD_DEPTH`` deep
            (named by its number).
    """
    records = []
    torn: ValueError | None = None  # a line that is no JSON: an error unless it is the last
    values = 0
    for number, line in _bounded_lines(path):
        if torn is not None:
            raise torn
        values += 1
        _check_values(values, path, number)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            torn = ValueError(f"{path}:{number}: not a JSON record: {err}")
            continue
        except (ValueError, RecursionError) as err:  # an int past 4,300 digits; deep nesting
            raise ValueError(f"{path}:{number}: not a record to draw: {_reason(err)}") from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{number}: a record is a JSON object, got a {type(record).__name__}"
            )
        depth, count = _shape(record, MAX_RECORD_DEPTH)
        if depth > MAX_RECORD_DEPTH:
            raise ValueError(
                f"{path}:{number}: a record nested more than {MAX_RECORD_DEPTH} levels deep"
            )
        values += count
        _check_values(values, path, number)
        records.append(record)
    return records


def read_progress_csv(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Rows of a ``progress.csv`` with every cell as float (empty cells -> NaN).

    Raises:
        OSError: the file cannot be opened.
        ValueError: not a regular file, past one of the bounds (``MAX_LOG_*``), a row with
            more cells than the header, or a cell that is no number (named by its line).
    """
    reader = csv.DictReader((line for _, line in _bounded_lines(path)), restkey=_EXTRA_CELLS)
    rows = []
    values = 0
    try:
        for row in reader:
            if _EXTRA_CELLS in row:
                header = len(reader.fieldnames or ())
                raise ValueError(
                    f"{path}:{reader.line_num}: a row of {header + len(row[_EXTRA_CELLS])} "
                    f"cells under a header of {header}"
                )
            values += len(row) + 1
            _check_values(values, path, reader.line_num)
            rows.append({key: _cell(cell, path, reader.line_num) for key, cell in row.items()})
    except csv.Error as err:  # e.g. a cell longer than the csv module's field limit
        raise ValueError(f"{path}:{reader.line_num + 1}: not CSV: {err}") from None
    return rows


def _bounded_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """``(number, line)`` of a regular file of at most ``MAX_LOG_BYTES``, each line at most
    ``MAX_LINE_CHARS`` (read line by line: a file of newlines is no list of empty strings)."""
    # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first column's name.
    text = read_regular_file(path, max_bytes=MAX_LOG_BYTES).decode("utf-8-sig")
    stream = io.StringIO(text, newline="")
    number = 0
    while line := stream.readline(MAX_LINE_CHARS + 1):
        number += 1
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(
                f"{path}:{number}: a line longer than the {MAX_LINE_CHARS:,} characters a "
                "record may take"
            )
        yield number, line


def _check_values(values: int, path: str | os.PathLike[str], number: int) -> None:
    if values > MAX_LOG_VALUES:
        raise ValueError(
            f"{path}:{number}: the log holds more than the {MAX_LOG_VALUES:,} values (lines, "
            "numbers, texts, lists, objects) plot reads; thin it first, e.g. keep every 10th line"
        )


def _cell(cell: str | None, path: str | os.PathLike[str], line: int) -> float:
    if cell in ("", None):
        return math.nan
    try:
        return float(cell)
    except ValueError:
        raise ValueError(f"{path}:{line}: a cell is not a number: {cell[:40]!r}") from None


def _reason(err: BaseException) -> str:
    if isinstance(err, RecursionError):
        return "nested too deep for Python's JSON reader"
    return str(err).partition(";")[0]


def _shape(value: Any, limit: int) -> tuple[int, int]:
    """``(levels, values)`` of parsed JSON, the levels counted up to ``limit + 1`` only;
    iterative, so no depth JSON allows can overflow the stack here."""
    stack = [(value, 1)]
    deepest = count = 0
    while stack:
        item, depth = stack.pop()
        count += 1
        deepest = max(deepest, depth)
        if depth > limit:
            break
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest, count


def plot_learning_curve(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    x: str = "env_steps",
    y: str | Sequence[str] = "episode_reward_mean",
    baselines: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Path:
    """Draws ``y`` (one or more columns) over ``x`` from ``rows`` into a PNG at ``path``.

    ``rows`` are progress.csv rows or metrics-log records; rows missing a
    value (or holding None/NaN, e.g. an interval without finished episodes)
    are left out of that line. ``baselines`` adds labelled horizontal lines,
    e.g. ``{"random policy": -110.0}``. Returns the path written.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'marl-runner[plot]'``).
        ValueError: no row has a finite value for any ``y`` column.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            f"plotting a learning curve needs matplotlib ({err}); "
            "install it with: pip install 'marl-runner[plot]'"
        ) from err
    columns = [y] if isinstance(y, str) else list(y)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    drawn = 0
    for column in columns:
        points = [
            (float(row[x]), float(row[column]))
            for row in rows
            if is_finite_number(row.get(x)) and is_finite_number(row.get(column))
        ]
        if points:
            xs, ys = zip(*points)
            axes.plot(xs, ys, label=column)
            drawn += 1
    if not drawn:
        plt.close(figure)
        raise ValueError(
            f"no row has finite values for x={x!r} and y={columns}; "
            f"the rows have columns {sorted(rows[0]) if rows else []}"
        )
    for index, (label, level) in enumerate((baselines or {}).items(), start=drawn):
        axes.axhline(level, linestyle="--", color=f"C{index}", label=f"{label} ({level:.1f})")
    axes.set_xlabel(x)
    axes.set_ylabel(columns[0] if len(columns) == 1 else "value")
    # `$` escaped: a title's "$5 vs $10" is text, not matplotlib's math between dollars.
    axes.set_title((title or f"{', '.join(columns)} over {x}").replace("$", r"\$"))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path = Path(path)
    if not path.suffix:  # what savefig writes: a PNG, under the name with .png added
        path = path.with_name(f"{path.name}.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def is_finite_number(value: Any) -> bool:
    """A real int or float that is not NaN or infinite (bools and None are not numbers here);
    an int too large for a float (JSON has no bound) counts as infinite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return -sys.float_info.max <= value <= sys.float_info.max  # exact, no float(value)
    return math.isfinite(value)
