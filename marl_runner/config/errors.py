"""``ConfigError`` and the words every config message is made of.

A config error names the dotted key, the value it got (shortened) and what was
expected; these helpers keep those words the same in every check.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ConfigError",
    "did_you_mean",
    "is_int",
    "kind_of",
    "quoted",
    "reject_unknown_keys",
    "shortened",
]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


class ConfigError(ValueError):
    """A config value that is missing, unknown or malformed.

    ``key`` is the dotted path of the offending entry (``policies.archer.model.type``),
    or None when the problem is the input as a whole; ``source`` names the
    file it came from, when there is one.
    """

    def __init__(self, key: str | None, problem: str, *, source: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.source = source
        text = f"{key}: {problem}" if key else problem
        super().__init__(f"{source}: {text}" if source else text)


def did_you_mean(value: Any, known: Iterable[str]) -> str:
    """`` (did you mean 'limit'?)`` for a near miss among ``known``, else ``""``."""
    if not isinstance(value, str):
        return ""
    matches = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


def quoted(names: Iterable[str]) -> str:
    """``'a', 'b'``: choices as a message lists them."""
    return ", ".join(repr(n) for n in names)


def shortened(value: Any) -> str:
    """``repr(value)`` cut short (``[0, 1, 2, 3, 4, 5, ...]``): a message shows what was
    wrong, never a whole config, however large (or alias-expanded) the value is."""
    return _REPR.repr(value)


def kind_of(value: Any) -> str:
    """``list [1, 2]``: a value with its type, for "got ..." messages."""
    return f"{type(value).__name__} {shortened(value)}"


def is_int(value: Any) -> bool:
    """A real integer (numpy ones included), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def reject_unknown_keys(data: Mapping[Any, Any], known: Sequence[str], *, prefix: str) -> None:
    """Raises naming the first key of ``data`` not in ``known`` (with a suggestion)."""
    for k in data:
        if k not in known:
            hint = did_you_mean(k, known) or f"; expected one of {quoted(known)}"
            raise ConfigError(f"{prefix}{k}", f"unknown key{hint}")
