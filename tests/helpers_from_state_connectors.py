"""User connectors that rebuild themselves through each form of ``from_state``.

docs/CONNECTORS.md lets a connector override ``from_state(ctx, params)`` as a
staticmethod or a classmethod, or not at all; the registry tests name these
by ``module:Class`` path and by registered name, as a config would.
"""

from __future__ import annotations

from typing import Any

from connectors import AgentConnector, AgentConnectorDataType, ConnectorContext


class ScaleRewards(AgentConnector):
    """Multiplies each row's reward by ``factor``; ``from_state`` not overridden."""

    def __init__(self, ctx: ConnectorContext, factor: float = 1.0) -> None:
        super().__init__(ctx)
        self.factor = factor

    def params(self) -> dict[str, Any]:
        return {"factor": self.factor}

    def transform(self, item: AgentConnectorDataType) -> AgentConnectorDataType:
        item.data["rewards"] = item.data["rewards"] * self.factor
        return item


class StaticScaleRewards(ScaleRewards):
    """``from_state`` as a staticmethod, accepting an older parameter name too."""

    @staticmethod
    def from_state(ctx: ConnectorContext, params: dict[str, Any]) -> StaticScaleRewards:
        params = dict(params)
        if "scale" in params:  # the name an older version saved
            params["factor"] = params.pop("scale")
        return StaticScaleRewards(ctx, **params)


class ClassScaleRewards(ScaleRewards):
    """``from_state`` as a classmethod, accepting an older parameter name too."""

    @classmethod
    def from_state(cls, ctx: ConnectorContext, params: dict[str, Any]) -> ClassScaleRewards:
        params = dict(params)
        if "scale" in params:
            params["factor"] = params.pop("scale")
        return cls(ctx, **params)
