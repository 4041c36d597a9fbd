"""Training batches: columns of equal length, per policy and across policies."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

_TENSORDICT_HINT = "install it with: pip install 'marl-runner[torchrl]'"


class SampleBatch(dict):
    """A dict of equal-length numpy columns, one row per agent step.

    Column names follow RLlib's so that training code written for it reads the
    same. ``infos`` is an object array; a Dict / Tuple obs or action column is
    a dict / tuple of arrays; every other column is a plain array. The runner's
    batches hold their numeric columns in one block of memory, so one column
    kept alone keeps the whole block: ``.copy()`` a column kept for long.
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
    AGENT_ID = "agent_id"
    ENV_T = "env_t"
    POLICY_VERSION = "policy_version"
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
        """Numeric columns as torch tensors on ``device``; object and string columns kept as
        they are."""
        import torch

        out: dict[str, Any] = {}
        for key, column in self.items():
            if isinstance(column, np.ndarray) and column.dtype.kind in "biuf":
                out[key] = torch.as_tensor(column, device=device)
            else:
                out[key] = column
        return out

    def minibatches(
        self, size: int, shuffle: bool = True, seed: int | None = None
    ) -> Iterator[SampleBatch]:
        """Consecutive minibatches of ``size`` rows covering every row once.

        With ``shuffle`` the rows are permuted once (one copy, ``seed`` makes
        the order repeatable) and the minibatches are views of that copy;
        without, they are views of this batch in row order. When ``size`` does
        not divide ``len(self)``, the last minibatch is smaller: it holds the
        remaining ``len(self) % size`` rows (none are dropped). Rows are cut
        one by one, so sequences (``seq_lens`` > 1) are not kept together.
        """
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"minibatches: size must be an int >= 1, got {size!r}")
        source = self
        if shuffle:
            source = self.select(np.random.default_rng(seed).permutation(len(self)))
        for start in range(0, len(self), int(size)):
            yield source.rows_slice(start, start + int(size))

    def split_by_episode(self) -> list[SampleBatch]:
        """One batch per ``eps_id``, in order of each episode's first row; rows keep their order."""
        if self.EPS_ID not in self:
            raise KeyError(f"split_by_episode: the batch has no {self.EPS_ID!r} column")
        eps_ids = np.asarray(self[self.EPS_ID])
        _, first_rows, which = np.unique(eps_ids, return_index=True, return_inverse=True)
        return [self.select(np.flatnonzero(which == i)) for i in np.argsort(first_rows)]

    def in_trajectory_order(self) -> SampleBatch:
        """The rows with each agent's trajectory contiguous and in time order (one copy).

        A runner hands rows out in the order it stored them, round by round (so
        ``obs`` needs no copy): each trajectory's rows are in time order but
        interleaved with the other agents'. Code that walks a trajectory's rows
        one after another (a GAE over the raw batch, say) calls this first.
        """
        for name in (self.EPS_ID, "agent_index", "t"):
            if name not in self:
                raise KeyError(f"in_trajectory_order: the batch has no {name!r} column")
        order = np.lexsort((self["t"], self["agent_index"], self[self.EPS_ID]))
        return self.select(order)

    def to_tensors(self, device: Any = "cpu") -> dict[str, Any]:
        """Numeric and bool columns as torch tensors on ``device`` (Dict columns as dicts of them).

        Columns torch cannot hold are left out: ``infos`` and other object
        columns, strings (agent ids). Use for the learner; ``to_torch`` keeps them.
        """
        import torch

        def convert(column: Any) -> Any:
            if isinstance(column, dict):
                return {k: convert(v) for k, v in column.items() if _is_numeric(v)}
            if isinstance(column, tuple):
                return tuple(convert(v) for v in column)
            return torch.as_tensor(column, device=device)

        return {key: convert(column) for key, column in self.items() if _is_numeric(column)}

    def to_tensordict(self, device: Any = None) -> Any:
        """The columns ``to_tensors`` keeps, as a ``tensordict.TensorDict`` of ``len(self)`` rows.

        Dict columns become nested TensorDicts; a Tuple column is refused (a
        TensorDict holds no tuples). Needs the optional ``torchrl`` extra.
        """
        try:
            import torch
            from tensordict import TensorDict
        except ImportError as exc:
            raise ImportError(
                f"SampleBatch.to_tensordict needs tensordict ({exc}); {_TENSORDICT_HINT}"
            ) from exc
        rows = [len(self)]

        def convert(name: str, column: Any) -> Any:
            if isinstance(column, tuple):
                raise TypeError(
                    f"to_tensordict: column {name!r} is a Tuple column; a TensorDict holds no "
                    "tuples (use to_tensors)"
                )
            if isinstance(column, dict):
                leaves = {k: convert(f"{name}/{k}", v) for k, v in column.items() if _is_numeric(v)}
                return TensorDict(leaves, batch_size=rows, device=device)
            return torch.as_tensor(column, device=device)

        columns = {k: convert(k, v) for k, v in self.items() if _is_numeric(v)}
        return TensorDict(columns, batch_size=rows, device=device)

    @classmethod
    def from_tensordict(cls, td: Any) -> SampleBatch:
        """A batch of numpy columns (on the CPU) from a TensorDict with one batch dimension."""
        try:
            from tensordict import TensorDictBase
        except ImportError as exc:
            raise ImportError(
                f"SampleBatch.from_tensordict needs tensordict ({exc}); {_TENSORDICT_HINT}"
            ) from exc
        if not isinstance(td, TensorDictBase) or len(td.batch_size) != 1:
            raise TypeError(
                "SampleBatch.from_tensordict expects a TensorDict with one batch dimension, got "
                f"{type(td).__name__} with batch_size {getattr(td, 'batch_size', None)}"
            )

        def convert(value: Any) -> Any:
            if isinstance(value, TensorDictBase):
                return {key: convert(value.get(key)) for key in value.keys()}
            return value.detach().cpu().numpy()

        return cls({key: convert(td.get(key)) for key in td.keys()})

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


def concat_multi_agent(batches: list[MultiAgentBatch]) -> MultiAgentBatch:
    """``concat_samples`` of MultiAgentBatches, and an empty one (not a SampleBatch) when
    there are none: what a flush with nothing left to hand out returns."""
    return concat_samples(batches) if batches else MultiAgentBatch({}, env_steps=0)


def _column_length(column: Any) -> int:
    if isinstance(column, dict):
        return _column_length(next(iter(column.values()))) if column else 0
    if isinstance(column, tuple):
        return _column_length(column[0]) if column else 0
    if isinstance(column, np.ndarray):
        return column.shape[0] if column.ndim else 1
    return len(column)


def _index_column(column: Any, index: Any) -> Any:
    """Rows of a column; a Dict / Tuple column row-indexed leaf by leaf."""
    if isinstance(column, dict):
        return {key: _index_column(leaf, index) for key, leaf in column.items()}
    if isinstance(column, tuple):
        return tuple(_index_column(leaf, index) for leaf in column)
    if isinstance(column, np.ndarray):
        return column[index]
    return np.asarray(column, dtype=object)[index]


def _concat_column(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], dict):
        return {key: _concat_column([part[key] for part in parts]) for key in parts[0]}
    if isinstance(parts[0], tuple):
        return tuple(_concat_column([part[i] for part in parts]) for i in range(len(parts[0])))
    return np.concatenate(parts, axis=0)


def _is_numeric(column: Any) -> bool:
    """Whether torch can hold the column: numbers and bools, or a Dict / Tuple of them."""
    return isinstance(column, (dict, tuple)) or np.asarray(column).dtype.kind in "biuf"


def _shape_of(column: Any) -> str:
    if isinstance(column, dict):
        return "{" + ", ".join(f"{k}: {_shape_of(v)}" for k, v in column.items()) + "}"
    if isinstance(column, tuple):
        return "(" + ", ".join(_shape_of(v) for v in column) + ")"
    if isinstance(column, np.ndarray):
        return f"{list(column.shape)}:{column.dtype}"
    return f"[{len(column)}]"
