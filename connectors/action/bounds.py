"""Fit Box actions into their bounds: unsquash from [-1, 1], or clip."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.base import ActionConnector, ConnectorContext
from connectors.data import ActionRows
from connectors.errors import ConnectorError

LeafFn = Callable[[Any], np.ndarray]


def _compile(space: gym.Space, box_fn: Callable[[gym.spaces.Box], LeafFn | None]) -> LeafFn | None:
    """A function applying ``box_fn``'s per-Box function throughout a nested action.

    None when no part of the space needs changing, so such spaces cost nothing.
    """
    if isinstance(space, gym.spaces.Box):
        return box_fn(space)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        items = (
            space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        )
        parts = {key: fn for key, sub in items if (fn := _compile(sub, box_fn)) is not None}
        if not parts:
            return None
        is_dict = isinstance(space, gym.spaces.Dict)

        def apply(actions: Any) -> Any:
            try:
                if is_dict:
                    return {k: parts[k](v) if k in parts else v for k, v in actions.items()}
                return tuple(parts[i](v) if i in parts else v for i, v in enumerate(actions))
            except (AttributeError, TypeError) as err:
                raise ConnectorError(
                    f"actions {type(actions).__name__} do not fit {space} ({err})"
                ) from None

        return apply
    return None


def _unsquash_box(space: gym.spaces.Box) -> LeafFn | None:
    finite = np.isfinite(space.low) & np.isfinite(space.high)
    if not np.issubdtype(space.dtype, np.floating) or not finite.any():
        return None
    low = np.where(finite, space.low, -1.0).astype(space.dtype)
    half_range = (0.5 * (np.where(finite, space.high, 1.0) - low)).astype(space.dtype)

    def unsquash(actions: Any) -> np.ndarray:
        actions = np.asarray(actions, dtype=space.dtype)
        out = low + (np.clip(actions, -1.0, 1.0) + 1.0) * half_range
        return out if finite.all() else np.where(finite, out, actions)

    return unsquash


def _clip_box(space: gym.spaces.Box) -> LeafFn | None:
    if not (np.isfinite(space.low).any() or np.isfinite(space.high).any()):
        return None
    low, high = space.low, space.high

    def clip(actions: Any) -> np.ndarray:
        return np.clip(np.asarray(actions, dtype=space.dtype), low, high)

    return clip


class _BoxActionConnector(ActionConnector):
    """Applies a per-Box function to every Box part of ``ctx.action_space``."""

    _box_fn: Callable[[gym.spaces.Box], LeafFn | None]

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._apply = _compile(ctx.action_space, type(self)._box_fn)

    def __call__(self, out: ActionRows) -> ActionRows:
        if self._apply is None:
            return out
        return out.replace(actions=self._apply(out.actions))


class NormalizeActionsConnector(_BoxActionConnector):
    """Maps Box actions from [-1, 1] (the policy's range) onto the space's bounds.

    Inputs are clipped to [-1, 1] first; dimensions with an infinite bound,
    integer Boxes and non-Box parts pass unchanged. Reads and writes: ``actions``.
    """

    _box_fn = staticmethod(_unsquash_box)


class ClipActionsConnector(_BoxActionConnector):
    """Clips Box actions to the space's bounds (non-Box parts pass).

    Reads and writes: ``actions``.
    """

    _box_fn = staticmethod(_clip_box)
