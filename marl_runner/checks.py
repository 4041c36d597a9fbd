"""Invariant checks on sampled batches, for our tests and for users' own envs.

Call ``check_batch_invariants(batch)`` on what ``EnvRunner.sample()`` returns;
it raises ``BatchInvariantError`` listing every violation it found.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from marl_runner.batch import MultiAgentBatch, SampleBatch


class BatchInvariantError(AssertionError):
    """A batch breaks one of the data guarantees the runner gives."""


def trajectory_rows(batch: SampleBatch) -> dict[tuple[int, int], np.ndarray]:
    """Row indices of each (eps_id, agent_index) trajectory, in batch (= time) order."""
    order = np.lexsort((np.arange(len(batch)), batch["agent_index"], batch["eps_id"]))
    eps, agents = batch["eps_id"][order], batch["agent_index"][order]
    boundaries = np.flatnonzero((eps[1:] != eps[:-1]) | (agents[1:] != agents[:-1])) + 1
    groups = np.split(order, boundaries)
    return {
        (int(batch["eps_id"][g[0]]), int(batch["agent_index"][g[0]])): g for g in groups if len(g)
    }


#: Columns the checks read; ``new_obs`` is checked where the batch has it.
REQUIRED_COLUMNS = ("obs", "t", "eps_id", "agent_index", "terminateds", "truncateds")
#: Where a batch says that a trajectory's first row continues an earlier fragment.
CONTINUES = "continues"


def check_batch_invariants(
    batch: MultiAgentBatch | SampleBatch,
    *,
    t_from_zero: bool = True,
    rollout_fragment_length: int | None = None,
    num_fragments: int | None = None,
) -> None:
    """Checks, per agent trajectory: t counts up by one, from 0 exactly where the
    episode starts (a first row marked in ``continues`` goes on from an earlier
    fragment instead; a batch without that column: every first row, unless
    ``t_from_zero`` is false), ``new_obs[i] == obs[i + 1]``, done flags only on
    the last row (both may be set there: an agent that ends itself in the round
    a time limit ends the episode); with ``rollout_fragment_length`` (env-step
    counting, truncate mode) also that the batch covers exactly
    ``num_fragments`` fragments of that length. A missing column is named.
    """
    problems: list[str] = []
    if isinstance(batch, MultiAgentBatch):
        for policy_id, policy_batch in batch.policy_batches.items():
            problems += [f"policy {policy_id!r}: {p}" for p in _problems(policy_batch, t_from_zero)]
        if rollout_fragment_length is not None:
            expected = rollout_fragment_length * (num_fragments or 1)
            if num_fragments is not None and batch.env_steps() != expected:
                problems.append(f"env_steps() is {batch.env_steps()}, expected {expected}")
            elif batch.env_steps() % rollout_fragment_length:
                problems.append(
                    f"env_steps() {batch.env_steps()} is not a multiple of "
                    f"rollout_fragment_length {rollout_fragment_length}"
                )
    else:
        problems = _problems(batch, t_from_zero)
    if problems:
        raise BatchInvariantError("batch invariants broken:\n  " + "\n  ".join(problems[:20]))


def _problems(batch: SampleBatch, t_from_zero: bool) -> list[str]:
    problems = []
    missing = [name for name in REQUIRED_COLUMNS if name not in batch]
    if missing:
        return [
            f"missing column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; "
            f"the checks read {', '.join(REQUIRED_COLUMNS)} (and new_obs, continues where present)"
        ]
    lengths = {name: len(column) for name, column in batch.items()}
    if len(set(lengths.values())) > 1:
        return [f"columns differ in length: {lengths}"]
    if not len(batch):
        return problems
    done = batch["terminateds"] | batch["truncateds"]
    continues = batch.get(CONTINUES)
    for (eps_id, agent_index), rows in trajectory_rows(batch).items():
        where = f"episode {eps_id} agent {agent_index}"
        t = batch["t"][rows]
        if continues is None:
            if t_from_zero and t[0] != 0:
                problems.append(f"{where}: t starts at {t[0]}, expected 0")
        elif continues[rows[0]]:
            if t[0] == 0:
                problems.append(
                    f"{where}: t starts at 0, but the batch says it continues an earlier fragment"
                )
        elif t[0] != 0:
            problems.append(
                f"{where}: t starts at {t[0]}, expected 0 (the batch says the episode starts "
                "here: a row is missing, or the continues column is wrong)"
            )
        if (np.diff(t) != 1).any():
            problems.append(f"{where}: t is not consecutive: {t.tolist()[:20]}")
        if done[rows[:-1]].any():
            problems.append(f"{where}: a done flag before the trajectory's last row")
        if "new_obs" in batch and len(rows) > 1:
            obs, new_obs = batch["obs"][rows], batch["new_obs"][rows]
            if not _equal(new_obs[:-1], obs[1:]):
                problems.append(f"{where}: new_obs[i] != obs[i + 1]")
    return problems


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and a.dtype != object:
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def rewards_per_trajectory(batch: MultiAgentBatch) -> dict[tuple[int, int], float]:
    """Summed rewards per (eps_id, agent_index), across policies."""
    totals: dict[tuple[int, int], float] = defaultdict(float)
    for policy_batch in batch.policy_batches.values():
        for key, rows in trajectory_rows(policy_batch).items():
            totals[key] += float(policy_batch["rewards"][rows].astype(np.float64).sum())
    return dict(totals)
