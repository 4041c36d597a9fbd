"""A per-item action connector from a plain function."""

from __future__ import annotations

from collections.abc import Callable

from connectors.base import ActionConnector, ConnectorContext
from connectors.data import ActionConnectorDataType
from connectors.function_connector import FunctionConnector

ActionItemFn = Callable[[ActionConnectorDataType], ActionConnectorDataType]


class LambdaActionConnector(FunctionConnector, ActionConnector):
    """Runs ``fn(item) -> item`` on every row of policy output (one item back per row).

    ``fn`` may be a callable or a ``"module:function"`` import path. Only an
    importable ``fn`` can be serialised; for a lambda or a local function use
    ``register_lambda_action_connector``.
    """

    register_hint = "register_lambda_action_connector"

    def __init__(self, ctx: ConnectorContext, fn: ActionItemFn | str) -> None:
        super().__init__(ctx)
        self._set_function(fn)
