"""Growable column buffers: rows appended round by round into preallocated arrays.

A policy's trajectory store appends each round's rows here, and a built batch
reads its opening-side columns straight out of these arrays: when a fragment's
opening rows are the buffer's first rows (every sub-env built at once, the
usual case), the batch's ``obs`` is a view of the buffer, not a copy
(``hand_off``). The buffer then lets go of its arrays, keeps the rows still
needed in small arrays of their own, and takes the arrays of an earlier batch
back once nothing else holds them (``ArrayPool``): memory is reused from
fragment to fragment instead of faulted in again, and a fragment's rows are
never held twice.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_MIN_CAPACITY = 256
# Arrays of handed-out batches a pool remembers (free ones are reused, busy ones forgotten).
_POOL_SIZE = 64


def _references(arrays: list, index: int) -> int:
    """``sys.getrefcount`` of ``arrays[index]``, read the one way ``ArrayPool.take`` reads it."""
    return sys.getrefcount(arrays[index])


# An array only a list holds: `take` reads its count beside each candidate's, on the same
# path, so what getrefcount counts besides the holders (it varies between Python versions:
# 3.14 borrows some references older ones counted) is measured, never assumed.
_ONLY_IN_A_LIST = [np.empty(0)]


class ArrayPool:
    """Arrays handed out in batches, taken back for new rows once no batch uses them.

    A batch column is a view of its array, and a view holds its base: when the
    trainer has dropped the batch, only the pool refers to the array.
    """

    __slots__ = ("_arrays",)

    def __init__(self) -> None:
        self._arrays: list[np.ndarray] = []

    def give(self, array: np.ndarray) -> None:
        """Remembers an array a batch now uses (the oldest remembered ones are forgotten)."""
        self._arrays.append(array)
        if len(self._arrays) > _POOL_SIZE:
            del self._arrays[0]

    def take(self, dtype: np.dtype, row_shape: tuple, min_rows: int) -> np.ndarray:
        """A free array of ``dtype`` and ``row_shape`` with at least ``min_rows`` rows
        (and not more than twice as many), or a new one."""
        arrays = self._arrays
        free = _references(_ONLY_IN_A_LIST, 0)
        for index in range(len(arrays)):
            if _references(arrays, index) != free:
                continue  # a batch still uses it
            array = arrays[index]
            if (
                array.dtype == dtype
                and array.shape[1:] == row_shape
                and min_rows <= len(array) <= 2 * min_rows
            ):
                del arrays[index]
                return array
        return np.empty((min_rows,) + row_shape, dtype)


class ColumnBuffer:
    """Named columns of equal length; ``view()`` is the rows held, oldest first."""

    __slots__ = ("size", "_capacity", "_arrays", "_pool", "_pending")

    def __init__(self) -> None:
        self.size = 0
        self._capacity = _MIN_CAPACITY  # rows every array holds (all grow together)
        self._arrays: dict[str, np.ndarray] = {}
        self._pool = ArrayPool()
        # Rows kept at a hand-off, in arrays of their own until the next append.
        self._pending: dict[str, np.ndarray] | None = None

    def append(self, columns: dict[str, Any], num_rows: int, rows: np.ndarray | None = None) -> None:
        """Adds ``num_rows`` rows; a 0-d value is that value on each of them. ``rows``:
        only these rows of each column (indices, ``num_rows`` of them), gathered straight
        into the buffer. A column missing here (or new here) is zero for the rows that
        lack it (a round in which every row was done has no action side)."""
        if self._pending is not None:
            self._restore_pending(num_rows)
        start, stop = self.size, self.size + num_rows
        arrays = self._arrays
        if stop > self._capacity:
            self._capacity = max(2 * self._capacity, stop)
            for name, array in arrays.items():
                arrays[name] = self._grown(array, start)
        for name, value in columns.items():
            array = arrays.get(name)
            if array is None:
                value = np.asarray(value)
                array = arrays[name] = self._new_array(value.dtype, value.shape[1:])
                array[:start] = 0
            if rows is None or not np.ndim(value):
                array[start:stop] = value
            elif value.dtype == array.dtype:
                # (One copy: indexing first would copy the rows once more.)
                value.take(rows, 0, array[start:stop], "clip")
            else:  # take's out= casts only where the cast back is safe; assignment casts all
                array[start:stop] = value[rows]
        if len(columns) < len(arrays):
            for name, array in arrays.items():
                if name not in columns:
                    array[start:stop] = 0
        self.size = stop

    def view(self) -> dict[str, np.ndarray]:
        """Every column's rows held (views: valid until the next append, ``keep`` or
        ``hand_off``)."""
        if self._pending is not None:
            return dict(self._pending)
        size = self.size
        return {name: array[:size] for name, array in self._arrays.items()}

    def keep(self, rows: np.ndarray) -> None:
        """Only ``rows`` (indices, in the order given) stay, moved to the front."""
        if self._pending is not None:
            self._pending = {name: column[rows] for name, column in self._pending.items()}
        else:
            size = self.size
            for array in self._arrays.values():
                array[: len(rows)] = np.take(array[:size], rows, axis=0)
        self.size = len(rows)

    def hand_off(self, rows: np.ndarray) -> None:
        """The arrays now belong to a batch (as views): only ``rows`` stay here, copied out;
        the next append takes arrays from the pool (or new ones) for them and what follows.

        A second hand-off before that append (``complete_episodes`` builds one batch per
        episode, several in a row) hands off the kept rows' own arrays the same way."""
        first = self._pending is None
        size = self.size
        kept = {name: array[:size] for name, array in self._arrays.items()} if first else self._pending
        self._pending = {name: np.take(column, rows, axis=0) for name, column in kept.items()}
        if first:
            for array in self._arrays.values():
                self._pool.give(array)
            self._arrays = {}
        self.size = len(rows)

    def clear(self) -> None:
        """No rows (the arrays stay, for the next rows)."""
        self.size = 0
        if self._pending is not None:
            self._pending = {name: column[:0] for name, column in self._pending.items()}

    def _restore_pending(self, num_rows: int) -> None:
        """Arrays again after a hand-off, sized as the last ones were, the kept rows first."""
        pending, self._pending = self._pending, None
        self._capacity = max(self._capacity, self.size + num_rows)
        for name, kept in pending.items():
            array = self._arrays[name] = self._new_array(kept.dtype, kept.shape[1:])
            array[: len(kept)] = kept

    def _new_array(self, dtype: np.dtype, row_shape: tuple) -> np.ndarray:
        return self._pool.take(np.dtype(dtype), tuple(row_shape), self._capacity)

    def _grown(self, array: np.ndarray, used: int) -> np.ndarray:
        """``array`` with room for the capacity's rows, its first ``used`` kept."""
        grown = self._new_array(array.dtype, array.shape[1:])
        grown[:used] = array[:used]
        return grown
