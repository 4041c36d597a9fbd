"""Experience batches sent by local-inference clients: to and from codec values."""

from __future__ import annotations

from typing import Any

import numpy as np

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.serving.validation import RequestError

REQUIRED_COLUMNS = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds")


def batch_to_value(batch: MultiAgentBatch) -> dict[str, Any]:
    """Numeric columns stay arrays; object columns (infos, nested actions) become lists."""
    return {
        "env_steps": batch.env_steps(),
        "policies": {
            pid: {
                name: column.tolist() if column.dtype == object else column
                for name, column in policy_batch.items()
            }
            for pid, policy_batch in batch.policy_batches.items()
        },
    }


def batch_from_value(value: Any, known_policies: set[str]) -> MultiAgentBatch:
    """A client's batch, checked: known policies, equal-length columns, the core columns."""
    if not isinstance(value, dict) or set(value) != {"env_steps", "policies"}:
        raise RequestError("experiences: expected an object with keys 'env_steps' and 'policies'")
    env_steps, policies = value["env_steps"], value["policies"]
    if isinstance(env_steps, bool) or not isinstance(env_steps, int) or env_steps < 0:
        raise RequestError(f"experiences.env_steps: {env_steps!r} is not an int >= 0")
    if not isinstance(policies, dict) or not policies:
        raise RequestError("experiences.policies: expected an object policy_id -> columns")
    policy_batches = {}
    for pid, columns in policies.items():
        if pid not in known_policies:
            raise RequestError(f"experiences: unknown policy {pid!r}; known: {sorted(known_policies)}")
        policy_batches[pid] = _policy_batch(pid, columns)
    return MultiAgentBatch(policy_batches, env_steps)


def _policy_batch(pid: str, columns: Any) -> SampleBatch:
    if not isinstance(columns, dict):
        raise RequestError(f"experiences.policies[{pid!r}]: expected an object column -> values")
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise RequestError(f"experiences.policies[{pid!r}]: missing columns {missing}")
    batch = SampleBatch()
    for name, column in columns.items():
        if isinstance(column, list):
            rows = np.empty(len(column), object)
            rows[:] = column
            column = rows
        if not isinstance(column, np.ndarray) or column.ndim == 0:
            raise RequestError(f"experiences.policies[{pid!r}][{name!r}]: expected an array or a list")
        batch[name] = column
    lengths = {name: len(column) for name, column in batch.items()}
    if len(set(lengths.values())) != 1:
        raise RequestError(f"experiences.policies[{pid!r}]: columns differ in length: {lengths}")
    return batch
