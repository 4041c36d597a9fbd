"""ColumnBuffer: every column grows with the others, rows stay in order across growth."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl_runner.sampling.columns import ArrayPool, ColumnBuffer


def test_columns_added_late_or_missing_stay_row_aligned_across_growth() -> None:
    buffer = ColumnBuffer()
    for start in range(0, 600, 100):  # grows past the initial capacity twice
        chunk = {"keys": np.arange(start, start + 100), "version": np.int64(start)}
        if start >= 300:
            chunk["late"] = np.ones((100, 2), np.float32)  # first seen after a growth
        if start != 400:
            chunk["obs"] = np.full((100, 3), start, np.float64)  # missing in one round
        buffer.append(chunk, 100)
    view = buffer.view()
    assert buffer.size == 600 and {len(column) for column in view.values()} == {600}
    np.testing.assert_array_equal(view["keys"], np.arange(600))
    np.testing.assert_array_equal(view["version"], np.repeat(np.arange(0, 600, 100), 100))
    np.testing.assert_array_equal(view["late"][:300], 0.0)
    np.testing.assert_array_equal(view["late"][300:], 1.0)
    expected_obs = np.repeat([0, 100, 200, 300, 0, 500], 100)
    np.testing.assert_array_equal(view["obs"], np.repeat(expected_obs[:, None], 3, axis=1))

    buffer.keep(np.array([599, 5]))
    np.testing.assert_array_equal(buffer.view()["keys"], [599, 5])
    buffer.append({"keys": np.array([7])}, 1)
    np.testing.assert_array_equal(buffer.view()["keys"], [599, 5, 7])
    assert buffer.view()["late"][2].tolist() == [0.0, 0.0]


def test_hand_offs_in_a_row_keep_each_batch_and_the_rows_left():
    """complete_episodes hands off once per finished episode, several before the next
    append: each batch keeps its rows, and the rows kept go on after them."""
    buffer = ColumnBuffer()
    buffer.append({"x": np.arange(6)}, 6)
    first = buffer.view()["x"][:2]  # a batch's view, as the trajectory store hands it out
    buffer.hand_off(np.array([2, 3, 4, 5]))
    second = buffer.view()["x"][:2]
    buffer.hand_off(np.array([2, 3]))
    buffer.append({"x": np.array([6])}, 1)
    np.testing.assert_array_equal(first, [0, 1])
    np.testing.assert_array_equal(second, [2, 3])
    np.testing.assert_array_equal(buffer.view()["x"], [4, 5, 6])


@pytest.mark.parametrize(
    ("first", "then"),
    [(np.float64, np.float32), (np.int64, np.int32), (np.int64, np.bool_), (np.float32, np.int64)],
)
def test_rows_gathered_into_a_buffer_of_another_dtype_are_cast_as_assignment_casts(first, then):
    """(Found in review.) A round with ending rows gathers them by index: a column whose
    dtype differs from the buffer's (float32 obs after float64 reset obs, say) is cast as
    a plain append casts it, where take(out=) refused all but safe casts."""
    buffer = ColumnBuffer()
    buffer.append({"x": np.zeros(3, first)}, 3)
    buffer.append({"x": np.array([1, 0, 1], then)}, 2, np.array([0, 2]))
    assert buffer.view()["x"].tolist() == [0, 0, 0, 1, 1]
    assert buffer.view()["x"].dtype == first



@pytest.mark.parametrize(
    "hold",
    [
        lambda column: column[:3],  # a view of a batch column
        lambda column: [column],  # the column itself, in a list
        torch.from_numpy,
        memoryview,
    ],
    ids=["view", "column", "torch", "memoryview"],
)
def test_a_pool_reuses_an_array_nothing_holds_and_never_one_something_does(hold) -> None:
    pool, float32 = ArrayPool(), np.dtype(np.float32)
    array = np.zeros((8, 2), np.float32)
    pooled = id(array)
    pool.give(array)
    held = hold(array[:6])  # what a trainer keeps of a batch: a view of the pooled array
    del array
    other = pool.take(float32, (2,), 8)
    other[:] = 1.0
    assert id(other) != pooled
    np.testing.assert_array_equal(np.asarray(held[0] if isinstance(held, list) else held), 0.0)
    del held
    assert id(pool.take(float32, (2,), 8)) == pooled  # free now: taken back
