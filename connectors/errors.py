"""The one error type of the connectors package, and the size bound it enforces."""

from __future__ import annotations

import math

#: The most values one observation may hold out of a connector (16,777,216: a 2,364 x
#: 2,364 RGB image). A connector's output space has bounds arrays of that size, and every
#: row and the policy's first layer grow with it: a resize to 20,000 x 20,000 took
#: gigabytes before anything ran.
MAX_OBS_VALUES = 1 << 24


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


def check_obs_size(connector: str, shape: tuple[int, ...], param: str | None = None) -> None:
    """Refuses an output observation shape of more than ``MAX_OBS_VALUES`` values, before
    the space (or anything the size of one observation) is made."""
    size = math.prod(shape)
    if size > MAX_OBS_VALUES:
        raise ConnectorError(
            f"{connector}: observations of shape {tuple(shape)} would hold {size:,} values, "
            f"more than the {MAX_OBS_VALUES:,} one observation may hold",
            param=param,
        )
