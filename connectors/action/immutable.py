"""Read-only actions, so an env cannot change what the trajectory stored."""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

from connectors.base import ActionConnector
from connectors.data import ActionRows


def _read_only(leaf: Any) -> Any:
    if not isinstance(leaf, np.ndarray):
        return leaf
    # A read-only view protects the env-bound actions without freezing the caller's array.
    view = leaf.view()
    view.flags.writeable = False
    return view


class ImmutableActionsConnector(ActionConnector):
    """Hands the env read-only views of the action arrays.

    Reads and writes: ``actions``.
    """

    def __call__(self, out: ActionRows) -> ActionRows:
        return out.replace(actions=tree.map_structure(_read_only, out.actions))
