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


def _unit_box(space: gym.spaces.Box) -> gym.spaces.Box:
    """``space`` with [-1, 1] wherever unsquashing applies (finite float bounds)."""
    finite = np.isfinite(space.low) & np.isfinite(space.high)
    if not np.issubdtype(space.dtype, np.floating) or not finite.any():
        return space
    low = np.where(finite, -1.0, space.low).astype(space.dtype)
    high = np.where(finite, 1.0, space.high).astype(space.dtype)
    return gym.spaces.Box(low, high, dtype=space.dtype)


def _map_boxes(space: gym.Space, box_fn: Callable[[gym.spaces.Box], gym.Space]) -> gym.Space:
    """``space`` with ``box_fn`` applied to every Box inside it (Dict/Tuple kept)."""
    if isinstance(space, gym.spaces.Box):
        return box_fn(space)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: _map_boxes(v, box_fn) for k, v in space.spaces.items()})
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple([_map_boxes(v, box_fn) for v in space.spaces])
    return space


class _BoxActionConnector(ActionConnector):
    """Applies a per-Box function to every Box part of the action space it outputs."""

    _box_fn: Callable[[gym.spaces.Box], LeafFn | None]

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._apply = _compile(ctx.action_space, type(self)._box_fn)

    def bind_output_space(self, space: gym.Space) -> gym.Space:
        taken = super().bind_output_space(space)
        self._apply = _compile(space, type(self)._box_fn)
        return taken

    def __call__(self, out: ActionRows) -> ActionRows:
        if self._apply is None:
            return out
        return out.replace(actions=self._apply(out.actions))


class NormalizeActionsConnector(_BoxActionConnector):
    """Maps Box actions from [-1, 1] (the policy's range) onto the space's bounds.

    Inputs are clipped to [-1, 1] first; dimensions with an infinite bound,
    integer Boxes and non-Box parts pass unchanged. The space it takes (so
    the policy's action space) is the env's with [-1, 1] for those Box
    dimensions. Reads and writes: ``actions``.
    """

    _box_fn = staticmethod(_unsquash_box)

    def input_action_space(self, space: gym.Space) -> gym.Space:
        return _map_boxes(space, _unit_box)


class ClipActionsConnector(_BoxActionConnector):
    """Clips Box actions to the space's bounds (non-Box parts pass).

    Reads and writes: ``actions``.
    """

    _box_fn = staticmethod(_clip_box)
