"""The one error type of the connectors package."""

from __future__ import annotations


class ConnectorError(ValueError):
    """A connector, pipeline or connector spec that cannot work as given.

    When the error comes from building a chain out of a spec list
    (``build_pipeline``, ``build_connectors``, ``get_connector``), ``index`` is
    the position of the offending item in that list and ``param`` the name of
    the offending parameter (None when the item as a whole is wrong), so a
    config loader can name the key (``policies.p.agent_connectors[0].limt``).
    """

    def __init__(self, message: str, *, index: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.param = param

    def at(self, index: int, prefix: str = "") -> ConnectorError:
        """The same error placed at item ``index`` of a spec list, ``prefix`` added to its text."""
        return ConnectorError(f"{prefix}{self}", index=index, param=self.param)
