"""Sequences for recurrent training: where rows split, and unrolling with gradients through time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl_runner.policy.sequences import sequence_lengths, unroll


def _rows(eps_id: list[int], agent_index: list[int], t: list[int]) -> dict[str, np.ndarray]:
    return {"eps_id": np.array(eps_id), "agent_index": np.array(agent_index), "t": np.array(t)}


def test_runs_split_at_new_episode_new_agent_and_gaps_then_at_max_len() -> None:
    batch = _rows(
        eps_id=[7, 7, 7, 7, 7, 7, 8, 8, 8, 8],
        agent_index=[0, 0, 0, 1, 1, 1, 0, 0, 0, 0],
        t=[0, 1, 2, 0, 1, 3, 0, 1, 2, 3],
    )
    assert sequence_lengths(batch, 10).tolist() == [3, 2, 1, 4]
    assert sequence_lengths(batch, 2).tolist() == [2, 1, 2, 1, 2, 2]
    assert sequence_lengths(batch, 1).tolist() == [1] * 10
    assert sequence_lengths(_rows([], [], []), 4).tolist() == []


def test_bad_arguments_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="max_seq_len must be >= 1"):
        sequence_lengths(_rows([1], [0], [0]), 0)
    with pytest.raises(ValueError, match="missing column 'agent_index'"):
        sequence_lengths({"eps_id": np.zeros(2), "t": np.arange(2)}, 4)
    step = _running_sum_step()
    with pytest.raises(ValueError, match="summing to the 3 rows"):
        unroll(step, torch.zeros(3, 1), [torch.zeros(3, 1)], [1, 1])


def _running_sum_step():
    """A recurrent 'model' whose output is the running sum of its inputs: easy to check."""

    def step(inputs: torch.Tensor, states: list[torch.Tensor]):
        total = states[0] + inputs
        return total, total.sum(-1), [total]

    return step


def test_unroll_carries_state_along_each_sequence_and_starts_from_the_first_rows_state() -> None:
    inputs = torch.tensor([[1.0], [2.0], [3.0], [10.0], [20.0], [100.0]])
    stored_states = torch.tensor([[0.5], [-99.0], [-99.0], [0.0], [-99.0], [7.0]])
    out, values = unroll(_running_sum_step(), inputs, [stored_states], [3, 2, 1])
    # Only each sequence's first stored state is used; later ones are replaced by the carried state.
    assert out[:, 0].tolist() == [1.5, 3.5, 6.5, 10.0, 30.0, 107.0]
    assert values.tolist() == out[:, 0].tolist()


def test_gradients_flow_back_through_time_within_a_sequence_only() -> None:
    inputs = torch.ones(5, 1, requires_grad=True)
    out, _ = unroll(_running_sum_step(), inputs, [torch.zeros(5, 1)], [3, 2])
    out[2, 0].backward()  # last step of the first sequence
    assert inputs.grad[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
