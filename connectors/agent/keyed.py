"""Per-trajectory-key state for stateful agent connectors.

Trajectory keys are small ints, unique per live (episode, agent) and recycled,
so per-agent state fits in one array indexed by key: one fancy-indexing op per
round instead of a dict lookup per agent.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class KeyedArray:
    """Rows of one fixed shape, one per trajectory key, grown geometrically."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, capacity: int = 64) -> None:
        self.data = np.zeros((capacity, *shape), dtype=dtype)

    def ensure(self, keys: np.ndarray) -> None:
        """Make room for every key in ``keys`` (new rows are zero)."""
        if keys.size == 0:
            return
        needed = int(keys.max()) + 1
        capacity = len(self.data)
        if needed > capacity:
            grown = np.zeros((max(needed, 2 * capacity), *self.data.shape[1:]), self.data.dtype)
            grown[:capacity] = self.data
            self.data = grown
