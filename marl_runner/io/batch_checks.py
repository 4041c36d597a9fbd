"""What both batch readers check in a file before using it: JSON, field types, column dtypes.

Batch files come from elsewhere (another machine, a colleague, a download),
so a reader treats them as data that may have been crafted: JSON is parsed
with a depth limit, every field is checked for its type before it is used,
and the columns with a meaning in ``SampleBatch`` get dtypes that fit it.
Every failure is a ``BatchFileError`` naming the file and the field.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

import numpy as np

from marl_runner.io.array_tree import depth_exceeds

__all__ = [
    "MAX_JSON_DEPTH",
    "BatchFileError",
    "check_column_dtype",
    "field",
    "load_json",
    "shortened",
]

#: JSON levels a header, manifest or column record may nest; real ones need about 8.
MAX_JSON_DEPTH = 64

_NUMBER = ("biuf", "a number (bool, int or float)")
_INTEGER = ("iu", "an integer")
_FLAG = ("b", "bool")
#: SampleBatch columns with a meaning, and the numpy dtype kinds that fit it.
COLUMN_KINDS: dict[str, tuple[str, str]] = {
    "rewards": _NUMBER,
    "action_logp": _NUMBER,
    "vf_preds": _NUMBER,
    "advantages": _NUMBER,
    "value_targets": _NUMBER,
    "prev_rewards": _NUMBER,
    "terminateds": _FLAG,
    "truncateds": _FLAG,
    "eps_id": _INTEGER,
    "env_id": _INTEGER,
    "agent_index": _INTEGER,
    "t": _INTEGER,
    "env_t": _INTEGER,
    "unroll_id": _INTEGER,
    "policy_version": _INTEGER,
    "seq_lens": _INTEGER,
}

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = 6
_REPR.maxlevel = 3


class BatchFileError(ValueError):
    """A batch file (or manifest) that cannot be read: names the file and the field."""

    def __init__(self, path: Any, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path} is not a readable marl-runner batch file: {problem}")


def shortened(value: Any) -> str:
    """``repr(value)`` cut short, for messages about values read from a file."""
    return _REPR.repr(value)


def load_json(raw: bytes | str, path: Any, what: str) -> Any:
    """The JSON in ``raw`` (``what``: "header", "manifest" ... for the message), at most
    ``MAX_JSON_DEPTH`` levels deep."""
    too_deep = f"its {what} is nested too deeply (expected at most {MAX_JSON_DEPTH} levels)"
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BatchFileError(path, too_deep) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise BatchFileError(path, f"its {what} is not valid JSON: {exc}") from None
    if depth_exceeds(value, MAX_JSON_DEPTH):
        raise BatchFileError(path, too_deep)
    return value


def field(container: Any, key: str, kind: type | tuple[type, ...], path: Any, where: str) -> Any:
    """``container[key]``, which must be a ``kind`` (``where``: the field's dotted name)."""
    if not isinstance(container, dict) or key not in container:
        raise BatchFileError(path, f"field {where!r} is missing")
    value = container[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BatchFileError(
            path, f"field {where!r} is {shortened(value)}; expected a JSON {_json_kind(kind)}"
        )
    return value


def check_column_dtype(name: Any, dtype: np.dtype, path: Any, where: str) -> None:
    """Columns with a meaning (rewards, done flags, ids, counters) must have a dtype that fits."""
    kinds = COLUMN_KINDS.get(name)
    if kinds is not None and dtype.kind not in kinds[0]:
        raise BatchFileError(
            path, f"column {where!r} has dtype {dtype.str}; expected {kinds[1]} for {name!r}"
        )


def _json_kind(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {dict: "object", list: "list", str: "string", int: "integer", float: "number"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)
