"""One policy's round rows put back in order when some came stacked from ``StepBlock``s.

Rows taken from a block arrive as arrays (obs ``[n, ...]``, rewards ``[n]``);
rows of the general path (spawns, episode ends, reset obs) one by one. The
agent connectors see one obs column: an array when every one-by-one obs is
an ndarray stacking like the blocks' rows, else a list of rows, as without
blocks, so the connectors stack or reject odd obs exactly as they do there.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")


def joined_rows(
    stacked: Sequence[tuple[int, np.ndarray, np.ndarray]], obs: list[Any], rewards: list[float]
) -> tuple[np.ndarray | list[Any], np.ndarray]:
    """``(obs column, float64 rewards)`` of all rows in order.

    ``stacked``: ``(first row, obs, rewards)`` per run of block rows, by first row;
    ``obs`` and ``rewards``: the other rows' values, in row order.
    """
    if not obs and len(stacked) == 1:
        return stacked[0][1], stacked[0][2]
    obs_pieces: list[np.ndarray | list[Any]] = []
    reward_pieces: list[np.ndarray] = []
    taken = row = 0  # one-by-one rows used so far; rows placed so far
    for first, block_obs, block_rewards in stacked:
        if first > row:
            obs_pieces.append(obs[taken : taken + first - row])
            reward_pieces.append(np.array(rewards[taken : taken + first - row], np.float64))
            taken += first - row
        obs_pieces.append(block_obs)
        reward_pieces.append(block_rewards)
        row = first + len(block_rewards)
    if taken < len(obs):
        obs_pieces.append(obs[taken:])
        reward_pieces.append(np.array(rewards[taken:], np.float64))
    return _joined_obs(obs_pieces, [piece for _, piece, _ in stacked]), np.concatenate(
        reward_pieces
    )


def _joined_obs(
    pieces: list[np.ndarray | list[Any]], blocks: list[np.ndarray]
) -> np.ndarray | list[Any]:
    """One array if all rows stack like the blocks' rows, else the list of all rows."""
    like = blocks[0]
    row_shape = like.shape[1:]
    loose = list(chain.from_iterable(piece for piece in pieces if type(piece) is list))
    if (
        {block.dtype for block in blocks} == {like.dtype}
        and {block.shape[1:] for block in blocks} == {row_shape}
        and set(map(type, loose)) <= {np.ndarray}
        and set(map(_DTYPE, loose)) <= {like.dtype}
        and set(map(_SHAPE, loose)) <= {row_shape}
    ):
        return np.concatenate(
            [np.stack(piece) if type(piece) is list else piece for piece in pieces]
        )
    return list(chain.from_iterable(pieces))  # a block's rows iterate as row arrays
