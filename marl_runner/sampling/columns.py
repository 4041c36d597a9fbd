"""Growable column buffers: rows appended round by round into preallocated arrays.

A policy's trajectory store appends each round's rows here instead of keeping
a list of per-round arrays, so building a fragment reads straight from one
array per column (no concatenation first), and the arrays are reused from
fragment to fragment (memory stays flat over a long run).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MIN_CAPACITY = 256


class ColumnBuffer:
    """Named columns of equal length; ``view()`` is the rows held, oldest first."""

    __slots__ = ("size", "_capacity", "_arrays")

    def __init__(self) -> None:
        self.size = 0
        self._capacity = _MIN_CAPACITY  # rows every array holds (all grow together)
        self._arrays: dict[str, np.ndarray] = {}

    def append(self, columns: dict[str, Any], num_rows: int) -> None:
        """Adds ``num_rows`` rows; a 0-d value is that value on each of them. A column
        missing here (or new here) is zero for the rows that lack it (a round in which
        every row was done has no action side)."""
        start, stop = self.size, self.size + num_rows
        arrays = self._arrays
        if stop > self._capacity:
            self._capacity = max(2 * self._capacity, stop)
            for name, array in arrays.items():
                arrays[name] = _grown(array, start, self._capacity)
        for name, value in columns.items():
            array = arrays.get(name)
            if array is None:
                value = np.asarray(value)
                array = arrays[name] = np.zeros((self._capacity,) + value.shape[1:], value.dtype)
            array[start:stop] = value
        if len(columns) < len(arrays):
            for name, array in arrays.items():
                if name not in columns:
                    array[start:stop] = 0
        self.size = stop

    def view(self) -> dict[str, np.ndarray]:
        """Every column's rows held (views: valid until the next append or ``keep``)."""
        size = self.size
        return {name: array[:size] for name, array in self._arrays.items()}

    def keep(self, rows: np.ndarray) -> None:
        """Only ``rows`` (indices, in the order given) stay, moved to the front."""
        size = self.size
        for array in self._arrays.values():
            array[: len(rows)] = np.take(array[:size], rows, axis=0)
        self.size = len(rows)

    def clear(self) -> None:
        """No rows (the arrays stay, for the next rows)."""
        self.size = 0


def _grown(array: np.ndarray, used: int, capacity: int) -> np.ndarray:
    """``array`` with room for ``capacity`` rows, its first ``used`` kept."""
    grown = np.zeros((capacity,) + array.shape[1:], array.dtype)
    grown[:used] = array[:used]
    return grown
