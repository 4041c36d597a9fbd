"""Exact comparison of env outputs, e.g. of two vector envs run on one seed."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same(first: Any, second: Any, path: str = "") -> None:
    """Assert that two nested env outputs are equal.

    Dicts must also have their keys in the same order, arrays equal values,
    and Exceptions the same type and message (they cannot be compared with
    `==`, and one that crossed a process boundary is a copy).
    """
    where = path or "value"
    if isinstance(first, Exception):
        assert type(first) is type(second) and str(first) == str(second), (
            f"{where}: {first!r} != {second!r}"
        )
    elif isinstance(first, dict):
        assert isinstance(second, dict) and list(first) == list(second), (
            f"{where}: keys {list(first)} != {list(second) if isinstance(second, dict) else second!r}"
        )
        for key in first:
            assert_same(first[key], second[key], f"{path}[{key!r}]")
    elif isinstance(first, tuple | list):
        assert isinstance(second, tuple | list) and len(first) == len(second), (
            f"{where}: {first!r} != {second!r}"
        )
        for index, (a, b) in enumerate(zip(first, second)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(first, np.ndarray):
        np.testing.assert_array_equal(first, second, err_msg=where)
    else:
        assert first == second, f"{where}: {first!r} != {second!r}"


def assert_identical(first: Any, second: Any, path: str = "") -> None:
    """``assert_same``, and every value of the same type: ``==`` lets 0 equal False,
    1.0 equal 1 and a float32 array equal a float64 one; a process boundary must not."""
    assert_same(first, second, path)
    _assert_same_types(first, second, path or "value")


def _assert_same_types(first: Any, second: Any, path: str) -> None:
    assert type(first) is type(second), f"{path}: {type(first)} != {type(second)}"
    if isinstance(first, np.ndarray):
        assert (first.dtype, first.shape) == (second.dtype, second.shape), path
    elif isinstance(first, dict):
        for key in first:
            _assert_same_types(first[key], second[key], f"{path}[{key!r}]")
    elif isinstance(first, tuple | list):
        for index, (a, b) in enumerate(zip(first, second)):
            _assert_same_types(a, b, f"{path}[{index}]")
