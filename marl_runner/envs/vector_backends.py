"""The registry of ``vectorize`` backends: each one's name, builder and config keys.

A backend is one ``register_vector_backend`` call: the config (checks, the
reference in docs/CONFIG.md), ``make_vector_env`` and the CLI read
everything about it from here, so a new backend is its own module plus that
line. The built-in ones are registered in ``marl_runner.envs.vectorize``.

This module imports no backend: a builder imports what it needs when it runs,
so registering costs nothing (no Ray, no torch).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from marl_runner.envs.base_env import BaseEnv
from marl_runner.envs.errors import EnvError
from marl_runner.envs.registry import EnvFactory

__all__ = [
    "BackendConfigError",
    "VectorBackend",
    "VectorBuild",
    "VectorKey",
    "bool_check",
    "int_check",
    "number_check",
    "register_vector_backend",
    "vector_backend",
    "vector_backend_names",
    "vector_keys",
]


class BackendConfigError(ValueError):
    """A backend's check found ``key`` wrong; the config reports it as a ``ConfigError``."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


@dataclasses.dataclass(frozen=True)
class VectorKey:
    """A top-level config key a backend reads, with its default and reference text.

    ``check(value)`` returns the value normalised (e.g. a numpy int as int) or
    raises ``ValueError`` whose message says what is expected ("an integer
    >= 1, or null"); the config prefixes the key and the value. Backends
    that share a key register the same ``VectorKey`` object.
    """

    name: str
    default: Any
    doc: str
    check: Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class VectorBuild:
    """What a builder gets: the settings every backend shares, plus its own keys' values."""

    factory: EnvFactory  # make_one(index) -> MultiAgentEnv, picklable for worker processes
    num_envs: int
    seed: int | None
    restart_failed: bool
    check_env_outputs: bool
    options: Mapping[str, Any]  # each of the backend's keys, its default when not set


@dataclasses.dataclass(frozen=True)
class VectorBackend:
    """One registered backend; see ``register_vector_backend``."""

    name: str
    builder: Callable[[VectorBuild], BaseEnv]
    doc: str
    keys: tuple[VectorKey, ...]
    check: Callable[[Any], None] | None
    validate_with: str


_BACKENDS: dict[str, VectorBackend] = {}


def register_vector_backend(
    name: str,
    builder: Callable[[VectorBuild], BaseEnv],
    *,
    doc: str,
    keys: Sequence[VectorKey] = (),
    check: Callable[[Any], None] | None = None,
    validate_with: str = "sync",
) -> None:
    """Makes ``vectorize: <name>`` build ``builder(VectorBuild)``.

    ``keys`` are the top-level config keys it reads (they appear in the
    config and its reference at once); ``check(config)`` looks at several
    keys together when this backend is chosen (e.g. "at most num_envs"),
    raising ``BackendConfigError``. ``validate_with`` names the backend
    ``marl-runner validate`` builds in its place, with one sub-env: ``sync``
    unless the env cannot be stepped in this process (``external``: itself).
    Registering a name again replaces it.
    """
    if not isinstance(name, str) or not name.strip():
        raise EnvError(f"register_vector_backend name {name!r}: expected a non-empty string")
    if not callable(builder):
        raise EnvError(f"register_vector_backend({name!r}): builder {builder!r} is not callable")
    if check is not None and not callable(check):
        raise EnvError(f"register_vector_backend({name!r}): check {check!r} is not callable")
    if validate_with != name and validate_with not in _BACKENDS:
        raise EnvError(
            f"register_vector_backend({name!r}): validate_with {validate_with!r}: expected "
            f"{name!r} or a registered backend, one of {list(_BACKENDS)}"
        )
    for key in keys:
        _check_key(name, key)
    _BACKENDS[name] = VectorBackend(name, builder, doc, tuple(keys), check, validate_with)


def vector_backend(name: Any) -> VectorBackend:
    """The backend ``vectorize: <name>`` builds; an unknown name lists the registered ones."""
    backend = _BACKENDS.get(name) if isinstance(name, str) else None
    if backend is None:
        names = vector_backend_names()
        raise EnvError(f"vectorize {name!r}: expected one of {list(names)}{_suggest(name, names)}")
    return backend


def vector_backend_names() -> tuple[str, ...]:
    """The registered backends, in registration order."""
    return tuple(_BACKENDS)


def vector_keys() -> dict[str, VectorKey]:
    """Every registered backend's keys by name, in registration order (shared keys once)."""
    return {key.name: key for backend in _BACKENDS.values() for key in backend.keys}


def int_check(minimum: int, *, optional: bool = False) -> Callable[[Any], Any]:
    """A ``VectorKey.check``: an integer (not a bool) >= ``minimum``; null too if ``optional``."""
    expected = f"an integer >= {minimum}" + (", or null" if optional else "")

    def check(value: Any) -> int | None:
        if value is None and optional:
            return None
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
            raise ValueError(expected)
        return int(value)

    return check


def number_check(
    expected: str, ok: Callable[[float], bool], *, optional: bool = False
) -> Callable[[Any], Any]:
    """A ``VectorKey.check``: an int or float (not a bool) for which ``ok`` holds."""

    def check(value: Any) -> float | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ValueError(expected)
        return value

    return check


def bool_check(value: Any) -> bool:
    """A ``VectorKey.check``: true or false, nothing that merely looks like one."""
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def _check_key(backend: str, key: Any) -> None:
    if not isinstance(key, VectorKey):
        raise EnvError(
            f"register_vector_backend({backend!r}): key {key!r}: expected a VectorKey"
        )
    if not key.name.isidentifier():
        raise EnvError(
            f"register_vector_backend({backend!r}): key name {key.name!r}: expected an "
            "identifier such as 'num_workers'"
        )
    for other in _BACKENDS.values():
        for known in other.keys:
            if other.name != backend and known.name == key.name and known != key:
                raise EnvError(
                    f"register_vector_backend({backend!r}): key {key.name!r} is already "
                    f"registered by backend {other.name!r} with another default, text or "
                    "check; share that VectorKey object or pick another name"
                )


def _suggest(name: Any, names: Sequence[str]) -> str:
    if not isinstance(name, str):
        return ""
    matches = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""
