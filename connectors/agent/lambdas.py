"""A per-item agent connector from a plain function."""

from __future__ import annotations

from collections.abc import Callable

from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentConnectorDataType
from connectors.function_connector import FunctionConnector

AgentItemFn = Callable[
    [AgentConnectorDataType], AgentConnectorDataType | list[AgentConnectorDataType]
]


class LambdaAgentConnector(FunctionConnector, AgentConnector):
    """Runs ``fn(item) -> item`` (or a list of items, to drop or add rows) on every row.

    ``fn`` may be a callable or a ``"module:function"`` import path. Only an
    importable ``fn`` can be serialised; for a lambda or a local function use
    ``register_lambda_agent_connector``.
    """

    register_hint = "register_lambda_agent_connector"

    def __init__(self, ctx: ConnectorContext, fn: AgentItemFn | str) -> None:
        super().__init__(ctx)
        self._set_function(fn)
