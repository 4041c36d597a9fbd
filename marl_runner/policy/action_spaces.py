"""Numpy helpers about action spaces, shared by every built-in policy.

Action masks and previous-action features depend only on the action space,
so the torch and the random policy read them the same way from here.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np

__all__ = [
    "MultiDiscreteLayout",
    "action_feature_size",
    "check_action_mask",
    "encode_actions",
    "multidiscrete_layout",
]


class MultiDiscreteLayout:
    """Where each MultiDiscrete dimension's entries sit in a concatenated row.

    Dimensions may have different sizes; gathering with ``gather_index`` turns
    a concatenated ``[n, sum(nvec)]`` row into a padded ``[n, d, max(nvec)]``
    block so that all dimensions are sampled with one vectorised op.
    ``valid`` marks the real (non-padding) entries of that block; ``sizes``
    and ``start`` are each dimension's number of actions and smallest action. Treat the arrays as read-only: a
    layout is shared by every caller with the same space.
    """

    def __init__(self, sizes: tuple[int, ...], start: tuple[int, ...]) -> None:
        sizes_array = np.asarray(sizes, dtype=np.int64)
        self.sizes = sizes_array
        self.start = np.asarray(start, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes_array)[:-1]]).astype(np.int64)
        position = np.arange(int(sizes_array.max()) if sizes else 0, dtype=np.int64)
        self.valid = position[None, :] < sizes_array[:, None]
        # Padding points at the dimension's first entry; `valid` hides it.
        self.gather_index = np.where(
            self.valid, self.offsets[:, None] + position, self.offsets[:, None]
        )


def multidiscrete_layout(space: gym.spaces.MultiDiscrete) -> MultiDiscreteLayout:
    """The (cached) layout of ``space``: built once, not on every call of a policy."""
    return _cached_layout(
        tuple(np.asarray(space.nvec).reshape(-1).tolist()),
        tuple(np.asarray(space.start).reshape(-1).tolist()),
    )


@functools.lru_cache(maxsize=256)
def _cached_layout(sizes: tuple[int, ...], start: tuple[int, ...]) -> MultiDiscreteLayout:
    return MultiDiscreteLayout(sizes, start)


def _mask_width(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    raise ValueError(
        f"action_mask is only supported for Discrete and MultiDiscrete action spaces, got {space}"
    )


def check_action_mask(mask: np.ndarray, space: gym.Space, num_rows: int) -> np.ndarray:
    """Returns ``mask`` as a bool ``[n, width]`` array after checking it can be honoured.

    A row that allows no action cannot be honoured by any policy, so it is an
    error here rather than a silently invalid action sent to the env.
    """
    mask = np.asarray(mask)
    width = _mask_width(space)
    if mask.shape != (num_rows, width):
        raise ValueError(
            f"action_mask has shape {mask.shape}, expected ({num_rows}, {width}) "
            f"(one row per agent, 1 = allowed) for action space {space}"
        )
    allowed = mask if mask.dtype == np.bool_ else mask != 0
    if isinstance(space, gym.spaces.MultiDiscrete):
        layout = multidiscrete_layout(space)
        any_allowed = (
            np.logical_or.reduceat(allowed, layout.offsets, axis=1) if num_rows else allowed
        )
        bad_rows, bad_dims = np.nonzero(~any_allowed)
        if bad_rows.size:
            raise ValueError(
                f"action_mask row {bad_rows[0]} allows no action for dimension {bad_dims[0]} "
                f"({np.unique(bad_rows).size} of {num_rows} rows have such a dimension); "
                "every dimension of every row needs at least one allowed action"
            )
        return allowed
    # The ufunc reduce and count_nonzero directly: ndarray.any/.all go through a Python
    # wrapper that costs more than the work on a round's few rows.
    row_allows_some = np.logical_or.reduce(allowed, axis=1)
    if np.count_nonzero(row_allows_some) == num_rows:  # the usual case: no bad row to find
        return allowed
    bad_rows = np.flatnonzero(~row_allows_some)
    raise ValueError(
        f"action_mask row {bad_rows[0]} allows no action ({bad_rows.size} of {num_rows} rows "
        "are all zeros); every row needs at least one allowed action"
    )


def action_feature_size(space: gym.Space) -> int:
    """Width of :func:`encode_actions` for ``space``."""
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        return _mask_width(space)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(f"cannot encode actions of space {space} as model input features")


def encode_actions(actions: np.ndarray, space: gym.Space) -> np.ndarray:
    """Actions as float32 model features: one-hot per discrete dimension, raw for Box.

    Used to feed previous actions to a model, so that a policy asking for
    ``prev_actions`` sees them the way it sees its observations. A discrete
    value outside the space (the connectors' zero fill before the first
    action, when ``start`` > 0) encodes as all zeros: "no action yet".
    """
    actions = np.asarray(actions)
    num_rows = len(actions)
    if isinstance(space, gym.spaces.Box):
        return actions.reshape(num_rows, action_feature_size(space)).astype(np.float32, copy=False)
    if isinstance(space, gym.spaces.Discrete):
        index = actions.reshape(num_rows, 1) - space.start
        sizes, offsets = np.array([space.n]), np.zeros(1, np.int64)
    else:
        layout = multidiscrete_layout(space)
        index = actions.reshape(num_rows, -1) - layout.start
        sizes, offsets = layout.sizes, layout.offsets
    in_space = (index >= 0) & (index < sizes)
    rows = np.broadcast_to(np.arange(num_rows)[:, None], index.shape)
    features = np.zeros((num_rows, action_feature_size(space)), dtype=np.float32)
    features[rows[in_space], (index + offsets)[in_space]] = 1.0
    return features
