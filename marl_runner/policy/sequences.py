"""Recurrent training on sequences: where a batch's rows split, and unrolling a model over them.

The runner stores one step per row together with the recurrent state the
model saw (``state_in_*``), so a trainer may score rows one at a time. To
backpropagate through time instead, it cuts each agent's rows into runs of
consecutive steps (:func:`sequence_lengths`) and passes them as
``seq_lens`` to ``TorchPolicy.evaluate``, which starts every sequence from
its first row's stored state and carries the state forward itself
(:func:`unroll`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["sequence_lengths", "sequence_starts", "unroll"]

StepFn = Callable[
    [torch.Tensor, list[torch.Tensor]], tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]
]


def sequence_lengths(batch: Mapping[str, Any], max_seq_len: int) -> np.ndarray:
    """Lengths of the runs of one agent's consecutive steps in one episode, in row order.

    A run starts wherever ``eps_id`` or ``agent_index`` changes or ``t`` is
    not the previous row's ``t + 1``; runs longer than ``max_seq_len`` are
    cut into pieces of ``max_seq_len`` (the last one shorter). Each
    trajectory's rows must be together, in time order: call
    ``batch.in_trajectory_order()`` first (a runner batch interleaves its
    agents' rows unless the policy post-processes them); an interleaved or
    shuffled batch gives runs of length 1.
    """
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    for column in ("eps_id", "agent_index", "t"):
        if column not in batch:
            raise ValueError(f"missing column {column!r}: sequences follow one agent's steps")
    eps_id, agent_index, t = (np.asarray(batch[c]) for c in ("eps_id", "agent_index", "t"))
    num_rows = len(t)
    if num_rows == 0:
        return np.zeros(0, np.int32)
    starts_run = np.ones(num_rows, bool)
    starts_run[1:] = (
        (eps_id[1:] != eps_id[:-1]) | (agent_index[1:] != agent_index[:-1]) | (t[1:] != t[:-1] + 1)
    )
    run_starts = np.flatnonzero(starts_run)
    run_lengths = np.diff(np.append(run_starts, num_rows))
    full, rest = np.divmod(run_lengths, max_seq_len)
    pieces = [
        np.full(f, max_seq_len) if r == 0 else np.append(np.full(f, max_seq_len), r)
        for f, r in zip(full, rest)
    ]
    return np.concatenate(pieces).astype(np.int32)


def sequence_starts(seq_lens: Sequence[int] | np.ndarray, num_rows: int) -> np.ndarray:
    """Row index of each sequence's first step; checks that ``seq_lens`` covers ``num_rows``."""
    lengths = np.asarray(seq_lens, dtype=np.int64)
    if lengths.ndim != 1 or np.any(lengths < 1) or lengths.sum() != num_rows:
        raise ValueError(
            f"seq_lens must be positive lengths summing to the {num_rows} rows of the batch, "
            f"got {len(lengths)} lengths summing to {int(lengths.sum())}"
        )
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def unroll(
    step: StepFn,
    inputs: torch.Tensor,
    states: Sequence[torch.Tensor],
    seq_lens: Sequence[int] | np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(model_out, values)`` per row, running ``step`` along each sequence with gradients.

    ``step(inputs, states) -> (model_out, values, state_out)`` is a one-step
    recurrent forward pass over a batch of rows. Every sequence starts from
    ``states`` at its first row; later rows' stored states are ignored, the
    state is carried from the previous step instead. Sequences are advanced
    together, longest first, so each call serves every sequence still
    running: ``max(seq_lens)`` calls in all.
    """
    lengths = np.asarray(seq_lens, dtype=np.int64)
    starts = sequence_starts(lengths, len(inputs))
    if len(inputs) == 0:
        model_out, values, _ = step(inputs, list(states))
        return model_out, values.reshape(-1)
    longest_first = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[longest_first], lengths[longest_first]
    first_rows = torch.from_numpy(starts).to(inputs.device)
    carried = [state[first_rows] for state in states]
    rows_per_step, outs, values = [], [], []
    for k in range(int(lengths[0])):
        running = int(np.count_nonzero(lengths > k))  # a prefix: sorted longest first
        rows = starts[:running] + k
        carried = [state[:running] for state in carried]
        out_k, values_k, carried = step(inputs[torch.from_numpy(rows).to(inputs.device)], carried)
        rows_per_step.append(rows)
        outs.append(out_k)
        values.append(values_k.reshape(-1))
    row_order = torch.from_numpy(np.argsort(np.concatenate(rows_per_step))).to(inputs.device)
    return torch.cat(outs)[row_order], torch.cat(values)[row_order]
