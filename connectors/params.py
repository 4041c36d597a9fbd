"""What a connector's constructor takes: parameter names and their annotated types.

Lets a spec list from a config be checked (``limt`` for ``limit``, ``limit:
"abc"``) before anything is built, and lets the error name the parameter.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import types
import typing
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["annotation", "constructor_parameters", "describe_type", "fits", "suggest"]


def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The parameters of ``cls(ctx, ...)`` after ``ctx``."""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return {}
    return {p.name: p for p in parameters[1:]}


def annotation(cls: type, param: str) -> Any:
    """The resolved type hint of ``param`` in ``cls.__init__``, or None when there is none."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a hint naming something only imported for type checkers
        return None
    return hints.get(param)


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` matches ``hint``; hints this cannot judge count as matching."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in typing.get_args(hint))
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, bool
        )
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    if origin is not None:
        hint = origin
    if hint is collections.abc.Callable:
        return callable(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def describe_type(hint: Any) -> str:
    """``float | None`` -> ``"a number or null"``: the words a config user needs."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(describe_type(arg) for arg in typing.get_args(hint))
    words = {
        float: "a number",
        int: "an integer",
        bool: "true or false",
        str: "a string",
        type(None): "null",
    }
    if hint in words:
        return words[hint]
    origin = typing.get_origin(hint) or hint
    if origin in (collections.abc.Mapping, dict):
        return "a mapping"
    if origin is collections.abc.Callable:
        return "a function"
    return getattr(hint, "__name__", str(hint))


def suggest(value: Any, known: Iterable[str]) -> str:
    """`` (did you mean 'limit'?)`` for a near miss, else ``""``."""
    if not isinstance(value, str):
        return ""
    matches = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""
