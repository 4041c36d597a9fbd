"""Reward shaping applied before rewards reach the trajectory."""

from __future__ import annotations

from typing import Any

import numpy as np

from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentRows
from connectors.errors import ConnectorError


class ClipRewardAgentConnector(AgentConnector):
    """Clips rewards to their sign (``sign=True``) and/or to ``[-limit, limit]``.

    Reads and writes: ``rewards``.
    """

    def __init__(
        self, ctx: ConnectorContext, sign: bool = False, limit: float | None = None
    ) -> None:
        super().__init__(ctx)
        if limit is not None and not limit > 0:
            raise ConnectorError(
                f"ClipRewardAgentConnector: limit must be > 0, got {limit!r}", param="limit"
            )
        self.sign = bool(sign)
        self.limit = None if limit is None else float(limit)

    def params(self) -> dict[str, Any]:
        return {"sign": self.sign, "limit": self.limit}

    def __call__(self, rows: AgentRows) -> AgentRows:
        rewards = np.asarray(rows["rewards"], dtype=np.float32)
        if self.sign:
            rewards = np.sign(rewards)
        if self.limit is not None:
            rewards = np.clip(rewards, -self.limit, self.limit)
        rows["rewards"] = rewards
        return rows
