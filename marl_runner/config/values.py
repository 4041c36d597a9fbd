"""Checks of single config values: each returns the normalised value or raises ``ConfigError``.

Every message names the dotted key, the value it got and what was expected.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from connectors.imports import ImportPathError, split_import_path
from marl_runner.config.errors import (
    ConfigError,
    did_you_mean,
    is_int,
    kind_of,
    quoted,
    shortened,
)
from marl_runner.config.schema import DEVICES

__all__ = [
    "check_bool",
    "check_choice",
    "check_device",
    "check_import_path",
    "check_int",
    "check_number",
    "check_str_keyed",
]

_CUDA_DEVICE = re.compile(r"cuda:\d+")


def check_int(value: Any, key: str, *, minimum: int | None, maximum: int | None = None) -> int:
    """An integer (not a bool), at least ``minimum`` and at most ``maximum`` when given."""
    if (
        not is_int(value)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        bound = f" >= {minimum}" if minimum is not None else ""
        if maximum is not None:
            bound += f"{' and' if bound else ''} <= {maximum:,}"
        raise ConfigError(key, f"got {shortened(value)}, expected an integer{bound}")
    return int(value)


def check_number(value: Any, key: str, expected: str, ok: Callable[[Any], bool]) -> float:
    """An int or float (not a bool) for which ``ok`` holds; ``expected`` words the rule."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(key, f"got {shortened(value)}, expected {expected}")
    return value


def check_bool(value: Any, key: str) -> bool:
    """True or false, nothing that merely looks like one (``"yes"``, 1)."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"got {shortened(value)}, expected true or false")
    return value


def check_choice(value: Any, key: str, choices: Sequence[str]) -> str:
    """One of ``choices``, with a suggestion for a near miss."""
    if value not in choices:
        raise ConfigError(
            key,
            f"got {shortened(value)}, expected one of {quoted(choices)}{did_you_mean(value, choices)}",
        )
    return value


def check_str_keyed(value: Any, key: str, what: str) -> dict[str, Any]:
    """A mapping with string keys (None -> {}), copied so the caller's data is never aliased."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"got {kind_of(value)}, expected a mapping of {what}")
    for k in value:
        if not isinstance(k, str):
            raise ConfigError(f"{key}.{k}", f"key {shortened(k)} must be a string")
    return copy.deepcopy(dict(value))


def check_import_path(path: Any, key: str, what: str) -> str:
    """The shape of ``'pkg.module:name'`` only: the import waits for ``check_imports``."""
    try:
        split_import_path(path)
    except ImportPathError:
        raise ConfigError(
            key, f"got {shortened(path)}, expected an import path 'pkg.module:name' naming {what}"
        ) from None
    return path.strip()


def check_device(device: Any) -> str:
    """cpu, cuda, cuda:N or auto."""
    if isinstance(device, str) and (device in DEVICES or _CUDA_DEVICE.fullmatch(device)):
        return device
    raise ConfigError(
        "device", f"got {shortened(device)}, expected one of {quoted(DEVICES)} or 'cuda:N'"
    )
