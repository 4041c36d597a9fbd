"""A batch's columns allocated together: views into one block of memory.

A fragment's columns are large (megabytes on wide runs) and new for every
fragment. Allocated one by one, most of them come from freshly mapped memory
whose every 4 KiB page faults on its first write, and that was most of the
time spent building a fragment. One block per batch is one allocation, which
the C allocator keeps and hands out again from fragment to fragment (cheap
workload, in the runner: ~3,800 page faults per policy batch before, ~800
after; 11.9 ms -> 7.1 ms per build).

The columns are ordinary writable C-contiguous arrays; each one keeps the
whole block alive, so a batch's memory is freed once none of its columns is
referenced any more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from marl_runner.sampling.columns import ArrayPool

# Column offsets in the block are multiples of a cache line (numpy's widest alignment is 16).
_ALIGN = 64

Layout = Mapping[str, tuple[np.dtype, tuple[int, ...]]]


def allocate_columns(
    layout: Layout, num_rows: int, pool: ArrayPool | None = None
) -> dict[str, np.ndarray | None]:
    """Empty columns of ``num_rows`` rows, in ``layout``'s order (name -> dtype, row shape);
    the block comes from ``pool`` (an earlier batch's, once that batch is dropped) where
    it can.

    Columns whose dtype holds Python objects cannot live in a raw block: they
    are None here, for the caller to fill with their own arrays.
    """
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    spans: dict[str, tuple[int, int]] = {}  # name -> (offset, size in bytes)
    total = 0
    for name, (dtype, shape) in layout.items():
        if not dtype.hasobject:
            size = num_rows * math.prod(shape) * dtype.itemsize
            spans[name] = (total, size)
            total += -(-size // _ALIGN) * _ALIGN
    if pool is None:
        block = np.empty(total, np.uint8)
    else:
        block = pool.take(np.dtype(np.uint8), (), total)
        pool.give(block)
    columns: dict[str, np.ndarray | None] = {}
    for name, (dtype, shape) in layout.items():
        if name in spans:
            start, size = spans[name]
            columns[name] = block[start : start + size].view(dtype).reshape((num_rows, *shape))
        else:
            columns[name] = None
    return columns


def take_rows(column: np.ndarray, rows: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``column[rows]`` written into ``out`` (or a new array when ``out`` is None).

    ``rows`` must be valid row indices: with ``out`` given, np.take's default
    mode copies through a temporary buffer, so "clip" is used (it clips nothing here).
    """
    if out is None:
        return np.take(column, rows, axis=0)
    return np.take(column, rows, axis=0, out=out, mode="clip")

