"""The ``vectorize`` backends' keys in a config: each checked, then the chosen backend's check.

The keys, their defaults and checks are registered with the backends
(``marl_runner.envs.vector_backends``); a config holds their values in
``vector_options`` and reads them as attributes (``config.num_workers``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import marl_runner.envs.vectorize  # noqa: F401  (registers the built-in backends)
from marl_runner.config.errors import ConfigError, reject_unknown_keys, shortened
from marl_runner.envs.vector_backends import (
    BackendConfigError,
    VectorKey,
    vector_backend,
    vector_keys,
)

__all__ = ["MAX_WAIT_S", "check_vector_options", "time_bound", "vector_keys_for"]

#: The longest wait a backend's time key may give (about 11.6 days): the backends turn
#: waits into deadlines of the OS's clocks, which end near 9e9 s; null waits forever.
MAX_WAIT_S = 1_000_000
#: Suffixes of the backends' time keys and their units per second.
_TIME_UNITS = {"_ms": ("ms", 1000), "_s": ("s", 1)}


def time_bound(name: str) -> str | None:
    """``"at most 1,000,000 s"`` for a time key (named ``*_s`` or ``*_ms``), else None."""
    for suffix, (unit, per_second) in _TIME_UNITS.items():
        if name.endswith(suffix):
            return f"at most {MAX_WAIT_S * per_second:,} {unit}"
    return None


def _check_time(name: str, value: Any) -> None:
    bound = time_bound(name)
    if bound is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    per_second = _TIME_UNITS["_ms"][1] if name.endswith("_ms") else 1
    if value > MAX_WAIT_S * per_second:
        forever = "; null waits forever" if name.endswith("timeout_s") else ""
        raise ConfigError(name, f"got {shortened(value)}, expected {bound}{forever}")


def vector_keys_for(config_class: type) -> dict[str, VectorKey]:
    """The registered backends' keys; one named like a field of ``config_class`` is refused."""
    keys = vector_keys()
    for field in dataclasses.fields(config_class):
        if field.name in keys:
            raise ConfigError(
                field.name,
                "is a top-level config key and also a key of a registered vectorize backend; "
                "the backend must name its key otherwise",
            )
    return keys


def check_vector_options(config: Any) -> None:
    """Checks and normalises ``config.vector_options`` in place (defaults filled in).

    Runs after ``vectorize`` and ``num_envs`` are checked, since a backend's
    own check compares its keys with them.
    """
    keys = vector_keys_for(type(config))
    given = config.vector_options
    reject_unknown_keys(given, tuple(keys), prefix="")
    options: dict[str, Any] = {}
    for name, key in keys.items():
        value = given.get(name, key.default)
        try:
            options[name] = key.check(value)
        except ValueError as exc:
            raise ConfigError(name, f"got {shortened(value)}, expected {exc}") from None
        _check_time(name, options[name])
    config.vector_options = options
    backend = vector_backend(config.vectorize)
    if backend.check is not None:
        try:
            backend.check(config)
        except BackendConfigError as exc:
            raise ConfigError(exc.key, exc.problem) from None
