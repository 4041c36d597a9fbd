"""Flatten nested row values for policies that want flat inputs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import tree

from connectors.base import AgentConnector
from connectors.data import META_COLUMNS, AgentRows
from connectors.errors import ConnectorError


def _flat_bounds(space: gym.Space) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of a space's leaves in dm-tree's order (Dict keys sorted), each leaf raveled."""
    if isinstance(space, gym.spaces.Box):
        return space.low.ravel().astype(np.float32), space.high.ravel().astype(np.float32)
    if isinstance(space, gym.spaces.Discrete):
        start = np.array([space.start], np.float32)
        return start, start + np.float32(space.n - 1)
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = space.start.ravel().astype(np.float32)
        return start, start + (space.nvec.ravel() - 1).astype(np.float32)
    if isinstance(space, gym.spaces.MultiBinary):
        size = int(np.prod(space.shape))
        return np.zeros(size, np.float32), np.ones(size, np.float32)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        parts = (
            [space.spaces[k] for k in sorted(space.spaces)]
            if isinstance(space, gym.spaces.Dict)
            else list(space.spaces)
        )
        bounds = [_flat_bounds(s) for s in parts]
        empty = np.zeros(0, np.float32)
        return (
            np.concatenate([empty] + [low for low, _ in bounds]),
            np.concatenate([empty] + [high for _, high in bounds]),
        )
    raise ConnectorError(
        f"FlattenDataAgentConnector cannot flatten observations of space {space}: "
        "expected Box, Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of those"
    )


def _flatten_column(name: str, column: Any, n: int) -> Any:
    """A column as [n] (scalar per row) or [n, d] (everything else flattened)."""
    if isinstance(column, np.ndarray):
        return column if column.ndim <= 2 else column.reshape(n, -1)
    if isinstance(column, (dict, tuple)):
        leaves = tree.flatten(column)
    else:
        if n == 0:
            return column
        per_row = [tree.flatten(value) for value in column]
        if all(len(leaves) == 1 and np.ndim(leaves[0]) == 0 for leaves in per_row):
            return np.asarray([leaves[0] for leaves in per_row])
        try:
            leaves = [np.asarray(part) for part in zip(*per_row, strict=True)]
        except ValueError as err:
            raise ConnectorError(
                f"FlattenDataAgentConnector: rows of column {name!r} differ in structure ({err})"
            ) from None
    if not leaves:
        return np.zeros((n, 0), dtype=np.float32)
    try:
        return np.concatenate([np.asarray(leaf).reshape(n, -1) for leaf in leaves], axis=1)
    except ValueError as err:
        raise ConnectorError(
            f"FlattenDataAgentConnector: column {name!r} does not flatten to {n} rows ({err})"
        ) from None


class FlattenDataAgentConnector(AgentConnector):
    """Flattens every data column's row values to vectors (dm-tree leaf order).

    A row value that is a scalar stays one (column ``[n]``); any other value
    (nested dicts/tuples, multi-dim arrays) becomes a 1-D vector of its leaves
    (column ``[n, d]``). ``obs`` always becomes float32 ``[n, d]``, matching
    the declared output space. Bookkeeping columns and ``state_in_*`` (whose
    shape the policy's RNN expects) are left alone.

    Reads and writes: every column except ``infos``, ``env_ids``,
    ``agent_ids``, ``keys``, ``is_first``, ``state_in_*``.
    """

    _obs_size: int | None = None

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        low, high = _flat_bounds(space)
        return gym.spaces.Box(low, high, dtype=np.float32)

    def bind_input_space(self, space: gym.Space) -> gym.Space:
        out = super().bind_input_space(space)
        self._obs_size = out.shape[0]
        return out

    def __call__(self, rows: AgentRows) -> AgentRows:
        if self._obs_size is None:
            self.bind_input_space(self.input_observation_space)
        n = len(rows)
        for name, column in list(rows.columns.items()):
            if name in META_COLUMNS or name.startswith("state_in_"):
                continue
            flat = _flatten_column(name, column, n)
            if name == "obs":
                flat = np.asarray(flat, dtype=np.float32).reshape(n, self._obs_size)
            rows[name] = flat
        return rows
