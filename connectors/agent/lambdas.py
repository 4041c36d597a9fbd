"""A per-item agent connector from a plain function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentConnectorDataType
from connectors.errors import ConnectorError
from connectors.imports import import_object, import_path_of

AgentItemFn = Callable[
    [AgentConnectorDataType], AgentConnectorDataType | list[AgentConnectorDataType]
]


class LambdaAgentConnector(AgentConnector):
    """Runs ``fn(item) -> item`` (or a list of items, to drop or add rows) on every row.

    ``fn`` may be a callable or a ``"module:function"`` import path (so it can
    be named in a config). Only an importable ``fn`` can be serialised; for a
    lambda or a local function use ``register_lambda_agent_connector``.
    """

    def __init__(self, ctx: ConnectorContext, fn: AgentItemFn | str) -> None:
        super().__init__(ctx)
        self.fn: AgentItemFn = import_object(fn) if isinstance(fn, str) else fn
        if not callable(self.fn):
            raise ConnectorError(f"{type(self).__name__}: fn must be callable, got {fn!r}")

    def transform(
        self, item: AgentConnectorDataType
    ) -> AgentConnectorDataType | list[AgentConnectorDataType]:
        return self.fn(item)

    def params(self) -> dict[str, Any]:
        path = import_path_of(self.fn)
        if path is None:
            raise ConnectorError(
                f"{type(self).__name__}({self.fn!r}) cannot be serialised: its function has no "
                "import path; pass a 'module:function' path or use register_lambda_agent_connector"
            )
        return {"fn": path}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fn={getattr(self.fn, '__qualname__', self.fn)!r})"
