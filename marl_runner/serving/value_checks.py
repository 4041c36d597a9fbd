"""Untrusted numbers, arrays and info values, checked against a space or for JSON safety.

One NaN observation poisons a shared mean-std filter for good, one complex
info value makes `write_batch` fail: refused here, naming the bad entry.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_INFO_DEPTH = 32
ACTION_MASK = "action_mask"
_REAL_KINDS = "biuf"


class RequestError(ValueError):
    """A request whose content does not fit what the server expects (answered with 400)."""


def to_space(space: gym.Space, value: Any, where: str) -> Any:
    """`value` converted to an element of `space`; `RequestError` when it does not fit."""
    if isinstance(space, gym.spaces.Discrete):
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise RequestError(f"{where}: {short(value)} is not an integer of {space}")
        if not int(space.start) <= value < int(space.start) + int(space.n):
            raise RequestError(f"{where}: {value} is outside {space}")
        return int(value)
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            raise RequestError(f"{where}: expected an object with keys {sorted(space.spaces)}")
        return {k: to_space(sub, value[k], f"{where}[{k!r}]") for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(space.spaces):
            raise RequestError(f"{where}: expected a list of {len(space.spaces)} values")
        return tuple(
            to_space(sub, v, f"{where}[{i}]") for i, (sub, v) in enumerate(zip(space.spaces, value))
        )
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return space_array(space, value, where)
    raise RequestError(f"{where}: the server cannot check values of {space} from clients")


def space_array(space: gym.Space, value: Any, where: str, *, rows: int | None = None) -> np.ndarray:
    """`value` as an array of the Box/MultiDiscrete/MultiBinary `space`'s dtype.

    Refuses what the cast would change: floats for an integer space, NaN or
    inf, entries outside the bounds, floats too large for a float32 space.
    `rows`: the value is a column of that many elements (an uploaded batch).
    """
    array = real_array(value, where)
    expected = tuple(space.shape) if rows is None else (rows, *space.shape)
    if array.shape != expected:
        raise RequestError(f"{where}: shape {array.shape}, expected {expected} of {space}")
    target = np.dtype(space.dtype)
    if array.dtype.kind == "f" and target.kind != "f":
        raise RequestError(f"{where}: expected integers for {space}, got {array.dtype} values")
    if array.dtype.kind == "f":
        refuse_first(~np.isfinite(array), array, where, "")
    low, high = _bounds(space)
    outside = (array < low) | (array > high)
    if outside.any():  # the space's repr is built only for the message
        refuse_first(outside, array, where, f", outside {space}")
    if array.dtype == target:
        return array
    with np.errstate(over="ignore"):  # an overflow is refused just below
        converted = array.astype(target)
    if target.kind == "f":
        refuse_first(~np.isfinite(converted), array, where, f", too large for {target}")
    return converted


def real_array(value: Any, where: str) -> np.ndarray:
    """`value` as a rectangular array of bools, ints or floats (never objects or complex)."""
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise RequestError(f"{where}: not a rectangular array of numbers") from None
    if array.dtype.kind not in _REAL_KINDS:
        raise RequestError(f"{where}: expected numbers, got an array of {array.dtype}")
    return array


def refuse_first(bad: np.ndarray, array: np.ndarray, where: str, why: str) -> None:
    """Raises `RequestError` naming the first entry where `bad` is true, if any."""
    if not bad.any():
        return
    index = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    value = array[index]
    at = "" if not index else f" at index {index[0] if len(index) == 1 else tuple(map(int, index))}"
    raise RequestError(f"{where} has {_describe(value)}{at}{why}")


def finite_reward(value: Any, where: str) -> float:
    """A reward as a float that the float32 reward column holds exactly enough (finite)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise RequestError(f"{where}: {short(value)} is not a finite number")
    try:
        number = float(value)
    except OverflowError:
        raise RequestError(f"{where}: {short(value)} is too large for a float") from None
    if not math.isfinite(number):
        raise RequestError(f"{where}: {number} is not a finite number")
    if abs(number) > FLOAT32_MAX:
        raise RequestError(
            f"{where}: {number:g} does not fit the float32 reward column (|reward| <= "
            f"{FLOAT32_MAX:.4g})"
        )
    return number


def json_safe(value: Any, where: str, depth: int = 0) -> Any:
    """`value` with numpy scalars made plain; refuses anything a batch file cannot store as JSON.

    Allowed: None, bools, ints, finite floats, strings, lists, dicts with
    string keys without '/', numpy scalars and arrays of real numbers.
    """
    if depth > MAX_INFO_DEPTH:
        raise RequestError(f"{where}: nested deeper than {MAX_INFO_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise RequestError(f"{where}: {value} is not finite (JSON has no NaN or inf)")
        return float(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _REAL_KINDS:
            raise RequestError(f"{where}: an array of {value.dtype}; expected real numbers")
        if value.dtype.kind == "f":
            refuse_first(~np.isfinite(value), value, where, " (JSON has no NaN or inf)")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or "/" in key:
                raise RequestError(f"{where}: key {short(key)} must be a string without '/'")
            out[key] = json_safe(item, f"{where}[{key!r}]", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [json_safe(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise RequestError(f"{where}: a {type(value).__name__} cannot be stored as JSON")


def check_action_mask(mask: Any, action_space: gym.Space, where: str) -> None:
    """A mask the policy can honour: one 0/1 entry per action, some action allowed.

    The runner turns masks into an int8 column and refuses rows that allow
    nothing; a bad mask from a client must be refused before it gets there.
    """
    if isinstance(action_space, gym.spaces.Discrete):
        sizes = [int(action_space.n)]
    elif isinstance(action_space, gym.spaces.MultiDiscrete):
        sizes = [int(n) for n in np.asarray(action_space.nvec).reshape(-1)]
    else:
        raise RequestError(
            f"{where}: an {ACTION_MASK} needs a Discrete or MultiDiscrete action space, "
            f"got {action_space}"
        )
    flat = real_array(mask, where).reshape(-1)
    if flat.size != sum(sizes):
        raise RequestError(
            f"{where}: {flat.size} entries, expected {sum(sizes)} (one per action of {action_space})"
        )
    refuse_first((flat != 0) & (flat != 1), flat, where, ", expected 0 or 1")
    offsets = np.cumsum([0, *sizes[:-1]])
    allowed = np.logical_or.reduceat(flat != 0, offsets)
    if not allowed.all():
        dimension = int(np.flatnonzero(~allowed)[0])
        part = f" for dimension {dimension}" if len(sizes) > 1 else ""
        raise RequestError(f"{where}: allows no action{part}; at least one must be 1")


def short(value: Any) -> str:
    """`repr(value)` cut to 60 characters, for error messages that echo client input."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounds(space: gym.Space) -> tuple[Any, Any]:
    if isinstance(space, gym.spaces.Box):
        return space.low, space.high
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start)
        return start, start + np.asarray(space.nvec) - 1
    return 0, 1  # MultiBinary


def _describe(value: Any) -> str:
    number = value.item() if isinstance(value, np.generic) else value
    if isinstance(number, float) and math.isnan(number):
        return "a NaN"
    if isinstance(number, float) and math.isinf(number):
        return "an inf" if number > 0 else "a -inf"
    return repr(number)
