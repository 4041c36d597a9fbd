"""Object columns whose rows are Dict observations, stored as one array per key and back.

Without an agent connector chain a Dict obs (Connect Four's ``observation``
and ``action_mask``) reaches the batch as an object column, one dict of
numpy arrays per row. Batch files store such a column as one array per key
(a Parquet struct, ``.npz`` entries per key) rather than as JSON, and give
back the same dicts of arrays, dtypes included.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def stack_row_dicts(column: np.ndarray) -> dict[str, Any] | None:
    """The rows' dicts as one dict of stacked arrays, or None when they are not all alike.

    Alike: every row a non-empty dict with the same string keys, each value
    (nested dicts allowed) a numpy array or scalar of the same shape and dtype
    in every row.
    """
    if not len(column) or not all(isinstance(row, dict) and row for row in column):
        return None
    first = column[0]
    if not all(row.keys() == first.keys() for row in column):
        return None
    stacked: dict[str, Any] = {}
    for key, value in first.items():
        if not isinstance(key, str):
            return None
        parts = [row[key] for row in column]
        if isinstance(value, dict):
            part_column = np.empty(len(parts), dtype=object)
            part_column[:] = parts
            nested = stack_row_dicts(part_column)
            if nested is None:
                return None
            stacked[key] = nested
        elif _alike_arrays(parts):
            stacked[key] = np.stack(parts)
        else:
            return None
    return stacked


def unstack_row_dicts(stacked: dict[str, Any]) -> np.ndarray:
    """The object column ``stack_row_dicts`` stacked: one dict per row."""
    leaf: Any = stacked
    while isinstance(leaf, dict):
        leaf = next(iter(leaf.values()))
    rows = len(leaf)
    column = np.empty(rows, dtype=object)
    column[:] = [_row(stacked, i) for i in range(rows)]
    return column


def _row(stacked: dict[str, Any], i: int) -> dict[str, Any]:
    return {
        key: _row(value, i) if isinstance(value, dict) else value[i]
        for key, value in stacked.items()
    }


def _alike_arrays(values: list[Any]) -> bool:
    first = values[0]
    if not isinstance(first, (np.ndarray, np.generic)) or first.dtype.kind not in "biuf":
        return False
    if isinstance(first, np.ndarray) and first.ndim == 0:
        return False  # a row of the stack would come back as a scalar, not a 0-d array
    kind = type(first)
    return all(
        type(v) is kind and v.dtype == first.dtype and v.shape == first.shape for v in values
    )
