"""Gymnasium spaces as YAML: ``{type: Box, low: -1.0, high: 1.0, shape: [3], dtype: float32}``.

Policies may declare their spaces in a config; ``space_to_spec`` writes a
space so that ``space_from_spec`` rebuilds an equal one, which is what lets a
config (and a checkpoint) be saved as plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.config.errors import ConfigError, quoted, reject_unknown_keys, shortened

__all__ = ["SPACE_TYPES", "space_from_spec", "space_to_spec"]

SPACE_TYPES = ("Discrete", "Box", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")

#: The most elements a Box or MultiBinary may declare (a 2048 x 2048 x 4 image). gymnasium
#: allocates a Box's bounds at full shape, so a config or checkpoint naming a huge shape
#: would otherwise cost gigabytes before any check could refuse it.
MAX_SPACE_ELEMENTS = 2**24


def space_from_spec(spec: Any, key: str = "space") -> gym.Space:
    """Builds a gymnasium space from its YAML form (see ``space_to_spec``)."""
    if not isinstance(spec, Mapping) or spec.get("type") not in SPACE_TYPES:
        raise ConfigError(
            key,
            f"got {spec!r}, expected a space such as {{type: Discrete, n: 6}} or "
            f"{{type: Box, low: -1.0, high: 1.0, shape: [3]}}; types: {quoted(SPACE_TYPES)}",
        )
    kind = spec["type"]
    allowed = {
        "Discrete": ("n", "start"),
        "Box": ("low", "high", "shape", "dtype"),
        "MultiDiscrete": ("nvec", "dtype"),
        "MultiBinary": ("n",),
        "Dict": ("spaces",),
        "Tuple": ("spaces",),
    }[kind]
    reject_unknown_keys({k: v for k, v in spec.items() if k != "type"}, allowed, prefix=f"{key}.")
    try:
        if kind == "Discrete":
            return gym.spaces.Discrete(spec["n"], start=spec.get("start", 0))
        if kind == "Box":
            dtype = np.dtype(spec.get("dtype", "float32"))
            shape = (
                _bounded_shape(spec["shape"], f"{key}.shape")
                if spec.get("shape") is not None
                else None
            )
            return gym.spaces.Box(
                _bound(spec["low"], dtype), _bound(spec["high"], dtype), shape=shape, dtype=dtype
            )
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(spec["nvec"], dtype=spec.get("dtype", "int64"))
        if kind == "MultiBinary":
            n = spec["n"]
            shape = _bounded_shape(n if isinstance(n, list) else [n], f"{key}.n")
            return gym.spaces.MultiBinary(list(shape) if isinstance(n, list) else n)
        if kind == "Dict":
            if not isinstance(spec["spaces"], Mapping):
                raise TypeError("'spaces' must be a mapping of name -> space")
            return gym.spaces.Dict(
                {k: space_from_spec(v, f"{key}.spaces.{k}") for k, v in spec["spaces"].items()}
            )
        if not isinstance(spec["spaces"], list):
            raise TypeError("'spaces' must be a list of spaces")
        return gym.spaces.Tuple(
            [space_from_spec(v, f"{key}.spaces[{i}]") for i, v in enumerate(spec["spaces"])]
        )
    except ConfigError:
        raise
    except KeyError as exc:
        raise ConfigError(
            key, f"{kind} space is missing {exc.args[0]!r} (keys: {quoted(allowed)})"
        ) from None
    except (TypeError, ValueError, AssertionError, OverflowError) as exc:  # (n: 2**70)
        raise ConfigError(key, f"invalid {kind} space {shortened(dict(spec))}: {exc}") from None


def _bounded_shape(shape: Any, where: str) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints with at most ``MAX_SPACE_ELEMENTS`` elements."""
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape
    ):
        raise ConfigError(where, f"got {shape!r}, expected a list of integers >= 0")
    elements = 1
    for size in shape:
        elements *= size
    if elements > MAX_SPACE_ELEMENTS:
        raise ConfigError(
            where,
            f"got {list(shape)}: {elements:,} elements, more than the {MAX_SPACE_ELEMENTS:,} "
            "a space may hold",
        )
    return tuple(shape)


def space_to_spec(space: gym.Space) -> dict[str, Any]:
    """The YAML-safe form of a space; ``space_from_spec`` rebuilds an equal space."""
    if isinstance(space, gym.spaces.Discrete):
        spec: dict[str, Any] = {"type": "Discrete", "n": int(space.n)}
        if int(space.start) != 0:
            spec["start"] = int(space.start)
        return spec
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": _uniform_or_list(space.low),
            "high": _uniform_or_list(space.high),
            "shape": list(space.shape),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "dtype": space.dtype.name}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_spec(v) for k, v in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_spec(v) for v in space.spaces]}
    raise ConfigError(
        None,
        f"cannot write a {type(space).__name__} space to a config; supported: {quoted(SPACE_TYPES)}",
    )


def _bound(value: Any, dtype: np.dtype) -> Any:
    """A Box bound in the Box's dtype: gymnasium wants scalars as scalars, lists as arrays."""
    return dtype.type(value) if np.ndim(value) == 0 else np.asarray(value, dtype=dtype)


def _uniform_or_list(values: np.ndarray) -> Any:
    """A scalar when every entry is equal (the common case), else the nested list."""
    flat = values.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return flat[0].item()
    return values.tolist()
