"""What the two lambda connectors share: a per-item function, named by import path when saved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.errors import ConnectorError
from connectors.imports import ImportPathError, import_object, import_path_of


class FunctionConnector:
    """Mixin for a connector whose per-item ``transform`` is a plain function.

    ``fn`` may be a callable or a ``"module:function"`` import path (so it can
    be named in a config). Only an importable ``fn`` can be serialised; the
    ``register_hint`` names the helper that registers a lambda instead.
    """

    register_hint = "register_lambda_agent_connector"

    def _set_function(self, fn: Callable[[Any], Any] | str) -> None:
        try:
            self.fn = import_object(fn) if isinstance(fn, str) else fn
        except ImportPathError as err:
            raise ConnectorError(f"{type(self).__name__}: fn: {err}", param="fn") from None
        if not callable(self.fn):
            raise ConnectorError(
                f"{type(self).__name__}: fn must be callable, got {fn!r}", param="fn"
            )

    def transform(self, item: Any) -> Any:
        """Applies ``fn`` to one item: the whole behaviour of a lambda connector lives in ``fn``."""
        return self.fn(item)

    def params(self) -> dict[str, Any]:
        """The ``fn`` import path, so a saved pipeline can rebuild this connector; fails for a
        function without one (a lambda), which could not be restored."""
        path = import_path_of(self.fn)
        if path is None:
            raise ConnectorError(
                f"{type(self).__name__}({self.fn!r}) cannot be serialised: its function has no "
                f"import path; pass a 'module:function' path or use {self.register_hint}"
            )
        return {"fn": path}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fn={getattr(self.fn, '__qualname__', self.fn)!r})"
