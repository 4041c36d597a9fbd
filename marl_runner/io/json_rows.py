"""Object columns (``infos``) as one JSON text per row, for files that must never unpickle.

A row JSON cannot hold (a set, bytes, an object, a tuple key, an int past
Python's 4300-digit limit, nesting deeper than ``MAX_ROW_DEPTH``) must not
cost the batch holding it, nor end the run: only the parts JSON cannot hold
are replaced, each by a marker object ``{"__not_json__": <type name>,
"repr": <its repr(), at most MAX_REPR_CHARS characters>}`` (a key by its
repr() text), and the first such row of a column is logged once, naming the
row's sub-env, agent and key (docs/DATA.md, "infos").
"""

from __future__ import annotations

import json
import logging
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from marl_runner.io.array_tree import depth_exceeds

logger = logging.getLogger(__name__)

#: Levels a row may nest; what lies deeper is stored as one marker.
MAX_ROW_DEPTH = 64
#: Characters of a replaced value's repr() kept in its marker.
MAX_REPR_CHARS = 10_000
#: The key of the object that stands for a value JSON cannot hold.
NOT_JSON = "__not_json__"

_KEY_TYPES = (str, int, float, bool, type(None))
#: repr() of what the full repr() cannot write: at most 20 levels, long strings and lists kept.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 20
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = MAX_REPR_CHARS
for _kind in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_SHORT_REPR, _kind, 1000)
#: Columns whose replaced values were logged already: one warning per column per process.
_warned: set[str] = set()


def rows_to_json(
    column: Iterable[Any], where: str, row_name: Callable[[int], str] | None = None
) -> list[str]:
    """Each row of an object column as JSON: numpy values become numbers and lists, tuples
    lists, and what JSON cannot hold a marker (see the module). ``row_name(i)`` says which
    sub-env and agent row ``i`` belongs to, for the one warning about replaced values."""
    texts = []
    replaced: list[tuple[int, list[str]]] = []
    for i, value in enumerate(column):
        # Most rows of `infos`; through the encoder, most of the time a batch file takes to write.
        if type(value) is dict and not value:
            texts.append("{}")
            continue
        try:
            text = _encode(value)
        except (TypeError, ValueError, RecursionError):
            text = None
        if text is None or _too_deep(text):
            paths: list[str] = []
            text = _encode(_jsonable(value, "", 1, paths))
            if paths:  # (a numpy key, or a row exactly at the depth limit, replaces nothing)
                replaced.append((i, paths))
        texts.append(text)
    if replaced and where not in _warned:
        _warned.add(where)
        _warn(where, replaced, row_name)
    return texts


def row_namer(batch: Mapping[str, Any]) -> Callable[[int], str]:
    """Names a row of ``batch`` by its ``env_id`` (the sub-env) and ``agent_id`` columns,
    where the batch has them."""

    def name(row: int) -> str:
        ids = [
            f"{key} {_plain(batch[key][row])!r}"
            for key in ("env_id", "agent_id")
            if key in batch and isinstance(batch[key], np.ndarray) and len(batch[key]) > row
        ]
        return f"row {row}" + (f" ({', '.join(ids)})" if ids else "")

    return name


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r}")


_encode = json.JSONEncoder(default=_json_default).encode


def _too_deep(text: str) -> bool:
    """Whether a row's JSON nests deeper than ``MAX_ROW_DEPTH``: a row does at most as
    deep as it has brackets, so only a long row with many is parsed again."""
    if len(text) <= 2 * MAX_ROW_DEPTH or text.count("[") + text.count("{") <= MAX_ROW_DEPTH:
        return False
    try:
        return depth_exceeds(json.loads(text), MAX_ROW_DEPTH)
    except RecursionError:
        return True


def _jsonable(value: Any, path: str, depth: int, paths: list[str]) -> Any:
    """``value`` with every part JSON cannot hold replaced by a marker (its path noted)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (dict, list, tuple)) and depth > MAX_ROW_DEPTH:
        paths.append(f"{path} (nested deeper than {MAX_ROW_DEPTH} levels)")
        return _marker(value)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            key = _json_key(key, path, paths)
            out[key] = _jsonable(item, f"{path}[{key!r}]", depth + 1, paths)
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{path}[{i}]", depth + 1, paths) for i, item in enumerate(value)]
    if isinstance(value, (str, float, type(None))) or (isinstance(value, int) and _fits(value)):
        return value
    paths.append(f"{path or 'the whole row'} ({type(value).__name__})")
    return _marker(value)


def _json_key(key: Any, path: str, paths: list[str]) -> Any:
    if isinstance(key, np.generic):
        key = key.item()
    if isinstance(key, _KEY_TYPES) and not (isinstance(key, int) and not _fits(key)):
        return key
    text = _repr(key)
    paths.append(f"{path}[{text!r}] (a {type(key).__name__} key, stored as its repr)")
    return text


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _fits(number: int) -> bool:
    """Whether JSON can write ``number`` (Python refuses ints past 4300 decimal digits)."""
    try:
        str(number)
    except ValueError:
        return False
    return True


def _marker(value: Any) -> dict[str, str]:
    return {NOT_JSON: type(value).__name__, "repr": _repr(value)}


def _repr(value: Any) -> str:
    """``repr(value)``, cut at ``MAX_REPR_CHARS``; what it cannot write (an int past 4300
    digits: its hex; thousands of levels: the first 20) another way; any failure named."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 -- an env's own object: any repr() may fail
        try:
            text = hex(value) if isinstance(value, int) else _SHORT_REPR.repr(value)
        except Exception as exc:  # noqa: BLE001
            text = f"<{type(value).__name__}: repr() failed: {type(exc).__name__}: {exc}>"
    return text if len(text) <= MAX_REPR_CHARS else text[: MAX_REPR_CHARS - 3] + "..."


def _warn(
    where: str, replaced: list[tuple[int, list[str]]], row_name: Callable[[int], str] | None
) -> None:
    row, paths = replaced[0]
    who = row_name(row) if row_name is not None else f"row {row}"
    more = f" (and {len(replaced) - 1} more rows of this batch)" if len(replaced) > 1 else ""
    logger.warning(
        "write_batch: column %r, %s: JSON cannot hold info %s%s; stored as {%r: <type>, "
        "'repr': <its repr()>} (docs/DATA.md, 'infos'); later ones in this column are stored "
        "the same way without a warning; `exclude_columns: [infos]` leaves infos out",
        where,
        who,
        ", ".join(_cut(path) for path in paths[:5])
        + (f" and {len(paths) - 5} more" if len(paths) > 5 else ""),
        more,
        NOT_JSON,
    )


def _cut(path: str) -> str:
    """A path for the warning: a deep one (64 levels of keys) is cut in the middle."""
    return path if len(path) <= 200 else f"{path[:90]} ... {path[-90:]}"
