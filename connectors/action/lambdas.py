"""A per-item action connector from a plain function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.base import ActionConnector, ConnectorContext
from connectors.data import ActionConnectorDataType
from connectors.errors import ConnectorError
from connectors.imports import import_object, import_path_of

ActionItemFn = Callable[[ActionConnectorDataType], ActionConnectorDataType]


class LambdaActionConnector(ActionConnector):
    """Runs ``fn(item) -> item`` on every row of policy output (one item back per row).

    ``fn`` may be a callable or a ``"module:function"`` import path. Only an
    importable ``fn`` can be serialised; for a lambda or a local function use
    ``register_lambda_action_connector``.
    """

    def __init__(self, ctx: ConnectorContext, fn: ActionItemFn | str) -> None:
        super().__init__(ctx)
        self.fn: ActionItemFn = import_object(fn) if isinstance(fn, str) else fn
        if not callable(self.fn):
            raise ConnectorError(f"{type(self).__name__}: fn must be callable, got {fn!r}")

    def transform(self, item: ActionConnectorDataType) -> ActionConnectorDataType:
        return self.fn(item)

    def params(self) -> dict[str, Any]:
        path = import_path_of(self.fn)
        if path is None:
            raise ConnectorError(
                f"{type(self).__name__}({self.fn!r}) cannot be serialised: its function has no "
                "import path; pass a 'module:function' path or use register_lambda_action_connector"
            )
        return {"fn": path}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fn={getattr(self.fn, '__qualname__', self.fn)!r})"
