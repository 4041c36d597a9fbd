"""Helpers for the connector tests: row builders and tiny user connectors.

The user connectors are imported by ``module:Class`` path in the registry
tests, as a config would name them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from connectors import (
    ActionConnectorDataType,
    AgentConnector,
    AgentConnectorDataType,
    AgentRows,
    ConnectorContext,
)
from marl_runner.bench.envs.scripted_env import ScriptedEnv, every_round_script


def make_rows(
    obs: Any,
    *,
    keys: Any = None,
    is_first: Any = None,
    rewards: Any = None,
    infos: list[dict] | None = None,
    env_ids: Any = None,
    agent_ids: list[Any] | None = None,
) -> AgentRows:
    """One round of rows as the runner hands them to an agent pipeline."""
    n = len(obs)
    return AgentRows(
        {
            "obs": obs,
            "rewards": np.zeros(n, np.float32)
            if rewards is None
            else np.asarray(rewards, np.float32),
            "terminateds": np.zeros(n, np.bool_),
            "truncateds": np.zeros(n, np.bool_),
            "infos": [{} for _ in range(n)] if infos is None else infos,
            "env_ids": np.zeros(n, np.int64) if env_ids is None else np.asarray(env_ids, np.int64),
            "agent_ids": [f"agent_{i}" for i in range(n)] if agent_ids is None else agent_ids,
            "keys": np.arange(n, dtype=np.int64) if keys is None else np.asarray(keys, np.int64),
            "is_first": np.zeros(n, np.bool_)
            if is_first is None
            else np.asarray(is_first, np.bool_),
        }
    )


class AddToObs(AgentConnector):
    """A user connector written the short way: one per-item method."""

    def __init__(self, ctx: ConnectorContext, amount: float = 1.0) -> None:
        super().__init__(ctx)
        self.amount = amount

    def params(self) -> dict[str, Any]:
        return {"amount": self.amount}

    def transform(self, item: AgentConnectorDataType) -> AgentConnectorDataType:
        item.data["new_obs"] = item.data["new_obs"] + self.amount
        return item


def drop_agent_b(item: AgentConnectorDataType) -> list[AgentConnectorDataType]:
    """Drops every row of agent "b" (per-item connectors may drop rows)."""
    return [] if item.agent_id == "b" else [item]


def double_action(item: ActionConnectorDataType) -> ActionConnectorDataType:
    action, states, extra = item.output
    item.output = (action * 2, states, extra)
    return item


class RecordingBoxEnv(ScriptedEnv):
    """Two agents acting in Box(0, 10, (2,)); keeps every action it receives in ``received``."""

    def __init__(self, episode_len: int = 20) -> None:
        super().__init__(
            every_round_script(("a0", "a1"), episode_len),
            ("a0", "a1"),
            action_space=gym.spaces.Box(0.0, 10.0, (2,), np.float32),
        )
        self.received: list[np.ndarray] = []

    def _check_action(self, agent: Any, action: Any) -> None:
        super()._check_action(agent, np.asarray(action, np.float32))
        self.received.append(np.asarray(action))


def record_item_view(item: AgentConnectorDataType) -> AgentConnectorDataType:
    """A per-item connector that notes what it was shown (``SEEN_ITEMS``) and passes it on."""
    SEEN_ITEMS.append((item.env_id, item.agent_id, dict(item.data)))
    return item


SEEN_ITEMS: list[tuple[int, Any, dict[str, Any]]] = []
