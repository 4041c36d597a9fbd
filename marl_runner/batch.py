"""Training batches: columns of equal length, per policy and across policies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


class SampleBatch(dict):
    """A dict of equal-length numpy columns, one row per agent step.

    Column names follow RLlib's so that training code written for it reads the
    same. ``infos`` is an object array; every other column is a plain array.
    """

    OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    INFOS = "infos"
    EPS_ID = "eps_id"
    ENV_ID = "env_id"
    AGENT_INDEX = "agent_index"
    T = "t"
    UNROLL_ID = "unroll_id"
    ACTION_LOGP = "action_logp"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    SEQ_LENS = "seq_lens"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"

    def __len__(self) -> int:  # type: ignore[override]
        """Number of rows (not of columns, unlike a plain dict)."""
        for column in self.values():
            return _column_length(column)
        return 0

    @property
    def count(self) -> int:
        """Number of rows; RLlib's name for ``len(batch)``."""
        return len(self)

    def rows_slice(self, start: int, stop: int) -> SampleBatch:
        """Rows ``start:stop`` of every column (views, no copy)."""
        return SampleBatch({k: _index_column(v, slice(start, stop)) for k, v in self.items()})

    def select(self, index: np.ndarray | slice) -> SampleBatch:
        """Rows picked by a boolean mask, index array or slice."""
        return SampleBatch({k: _index_column(v, index) for k, v in self.items()})

    def to_torch(self, device: Any = "cpu") -> dict[str, Any]:
        """Numeric columns as torch tensors on ``device``; object columns kept as they are."""
        import torch

        out: dict[str, Any] = {}
        for key, column in self.items():
            if isinstance(column, np.ndarray) and column.dtype != object:
                out[key] = torch.as_tensor(column, device=device)
            else:
                out[key] = column
        return out

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}{_shape_of(v)}" for k, v in self.items())
        return f"SampleBatch({len(self)} rows: {cols})"


class MultiAgentBatch:
    """Per-policy batches from the same stretch of env steps."""

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int) -> None:
        self.policy_batches: dict[str, SampleBatch] = dict(policy_batches)
        self._env_steps = int(env_steps)

    def env_steps(self) -> int:
        """Env steps (rounds of a sub-env) this batch covers."""
        return self._env_steps

    def agent_steps(self) -> int:
        """Agent transitions in this batch, across all policies."""
        return sum(len(b) for b in self.policy_batches.values())

    def __len__(self) -> int:
        return self.agent_steps()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{pid}: {len(b)}" for pid, b in self.policy_batches.items())
        return f"MultiAgentBatch(env_steps={self._env_steps}, {{{sizes}}})"


def concat_samples(batches: Iterable[SampleBatch | MultiAgentBatch]) -> Any:
    """Concatenates batches of one kind: SampleBatches by column, MultiAgentBatches per policy."""
    batches = [b for b in batches if b is not None]
    if not batches:
        return SampleBatch()
    if all(isinstance(b, MultiAgentBatch) for b in batches):
        per_policy: dict[str, list[SampleBatch]] = {}
        for batch in batches:
            for pid, pb in batch.policy_batches.items():
                per_policy.setdefault(pid, []).append(pb)
        return MultiAgentBatch(
            {pid: concat_samples(parts) for pid, parts in per_policy.items()},
            env_steps=sum(b.env_steps() for b in batches),
        )
    if any(isinstance(b, MultiAgentBatch) for b in batches):
        raise TypeError("concat_samples: cannot mix SampleBatch and MultiAgentBatch")
    non_empty = [b for b in batches if len(b)]
    if not non_empty:
        return SampleBatch()
    keys = list(non_empty[0].keys())
    for i, batch in enumerate(non_empty[1:], start=1):
        if set(batch.keys()) != set(keys):
            missing = set(keys) ^ set(batch.keys())
            raise ValueError(
                f"concat_samples: batch {i} has different columns than batch 0 "
                f"(differing: {sorted(missing)})"
            )
    return SampleBatch({k: _concat_column([b[k] for b in non_empty]) for k in keys})


def _column_length(column: Any) -> int:
    if isinstance(column, np.ndarray):
        return column.shape[0] if column.ndim else 1
    return len(column)


def _index_column(column: Any, index: Any) -> Any:
    if isinstance(column, np.ndarray):
        return column[index]
    return np.asarray(column, dtype=object)[index]


def _concat_column(parts: list[Any]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts, axis=0)


def _shape_of(column: Any) -> str:
    if isinstance(column, np.ndarray):
        return f"{list(column.shape)}:{column.dtype}"
    return f"[{len(column)}]"
