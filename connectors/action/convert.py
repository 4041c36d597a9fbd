"""Policy output tensors -> numpy arrays for the env."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import tree

from connectors.base import ActionConnector
from connectors.data import ActionRows


class ConvertToNumpyConnector(ActionConnector):
    """Turns torch tensors among the actions into numpy arrays (others pass).

    Reads and writes: ``actions``.
    """

    def __call__(self, out: ActionRows) -> ActionRows:
        # No tensor can exist unless torch was imported, so don't import it here.
        torch = sys.modules.get("torch")
        if torch is None or isinstance(out.actions, np.ndarray):
            return out

        def to_numpy(leaf: Any) -> Any:
            return leaf.detach().cpu().numpy() if isinstance(leaf, torch.Tensor) else leaf

        return out.replace(actions=tree.map_structure(to_numpy, out.actions))
