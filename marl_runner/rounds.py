"""Per-policy accumulation of one round's rows before they become arrays.

Rows are appended as plain Python values (cheap: whole groups at once on the
fast path), then turned into columns once per policy per round.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

from connectors.data import AgentRows
from marl_runner.trajectories import KeyTable


class RoundRows:
    """One policy's rows of a round, as growing lists.

    The object lives as long as its policy, so that sub-env layouts can point
    at it directly; ``to_agent_rows`` hands the lists over and starts afresh.
    A round fills it twice: env data first, then reset obs.
    """

    __slots__ = ("obs", "rewards", "infos", "keys", "terminated_rows", "truncated_rows", "first_rows")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.obs: list[Any] = []
        self.rewards: list[float] = []
        self.infos: list[Any] = []
        self.keys: list[int] = []
        self.terminated_rows: list[int] = []
        self.truncated_rows: list[int] = []
        self.first_rows: list[int] = []

    def add(
        self, obs: Any, reward: float, info: Any, key: int,
        terminated: bool, truncated: bool, is_first: bool,
    ) -> int:
        """Appends one row; returns its index in this round."""
        row = len(self.keys)
        self.obs.append(obs)
        self.rewards.append(reward)
        self.infos.append(info if info is not None else {})
        self.keys.append(key)
        if terminated:
            self.terminated_rows.append(row)
        if truncated:
            self.truncated_rows.append(row)
        if is_first:
            self.first_rows.append(row)
        return row

    def to_agent_rows(self, key_table: KeyTable) -> tuple[AgentRows, np.ndarray]:
        """Columns for the agent connectors, plus the raw float64 rewards (for metrics)."""
        n = len(self.keys)
        keys = np.array(self.keys, np.int64)
        raw_rewards = np.array(self.rewards, np.float64)
        terminateds = np.zeros(n, bool)
        truncateds = np.zeros(n, bool)
        is_first = np.zeros(n, bool)
        if self.terminated_rows:
            terminateds[self.terminated_rows] = True
        if self.truncated_rows:
            truncateds[self.truncated_rows] = True
        if self.first_rows:
            is_first[self.first_rows] = True
        rows = AgentRows(
            {
                "obs": self.obs,
                "rewards": raw_rewards.astype(np.float32),
                "terminateds": terminateds,
                "truncateds": truncateds,
                "infos": self.infos,
                "env_ids": key_table.env_id[keys],
                "agent_ids": key_table.agent_id[keys],
                "keys": keys,
                "is_first": is_first,
            }
        )
        self._clear()
        return rows, raw_rewards


def concat_rows(first: AgentRows, second: AgentRows) -> AgentRows:
    """Rows of two phases of one round (env data, then reset obs) as one set of columns."""
    columns = {}
    for name, column in first.columns.items():
        other = second[name]
        if isinstance(column, np.ndarray):
            columns[name] = np.concatenate([column, other])
        elif isinstance(column, (dict, tuple)):
            columns[name] = tree.map_structure(lambda a, b: np.concatenate([a, b]), column, other)
        else:
            columns[name] = list(column) + list(other)
    return AgentRows(columns)


def merge_rows(first: dict[str, AgentRows], second: dict[str, AgentRows]) -> dict[str, AgentRows]:
    merged = dict(first)
    for policy_id, rows in second.items():
        merged[policy_id] = rows if policy_id not in merged else concat_rows(merged[policy_id], rows)
    return merged
