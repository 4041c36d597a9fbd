"""Experience batches sent by local-inference clients: to and from codec values.

An upload is written to `--out` beside the server's own batches and counts
towards `--steps`, so every column is checked as a request's values are,
and its env steps are counted from its rows, never taken from the client.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.serving.value_checks import (
    FLOAT32_MAX,
    RequestError,
    json_safe,
    real_array,
    refuse_first,
    short,
    space_array,
)

REQUIRED_COLUMNS = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id", "t")
# Column names become parts of entry names in the batch files.
COLUMN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_FLAG_COLUMNS = ("terminateds", "truncateds")
_INTEGER_COLUMNS = ("eps_id", "t", "env_id", "agent_index", "unroll_id", "env_t", "policy_version")
# Agent ids: stored as a fixed-width string array, so a long one would cost every row its width.
MAX_AGENT_ID_CHARS = 64


def num_episodes(batch: MultiAgentBatch) -> int:
    """Distinct episode ids over all policies (an episode's agents may map to several): what
    `serve` counts, writes and reports."""
    ids = [pb["eps_id"] for pb in batch.policy_batches.values() if "eps_id" in pb and len(pb)]
    return len(np.unique(np.concatenate(ids))) if ids else 0


def batch_to_value(batch: MultiAgentBatch) -> dict[str, Any]:
    """Numeric columns stay arrays; object and string columns (infos, nested actions, agent
    ids) become lists."""
    return {
        "env_steps": batch.env_steps(),
        "policies": {
            pid: {
                name: column.tolist() if column.dtype.kind in "OU" else column
                for name, column in policy_batch.items()
            }
            for pid, policy_batch in batch.policy_batches.items()
        },
    }


def batch_from_value(value: Any, policy_map: dict[str, Any]) -> MultiAgentBatch:
    """A client's batch, checked against the policies of `policy_map`.

    The client's `env_steps` must be an int >= 0 but is not used: the batch
    counts the distinct (episode, time step) pairs of its rows, so a client
    cannot end a `--steps` run early by claiming steps it did not send.
    """
    if not isinstance(value, dict) or set(value) != {"env_steps", "policies"}:
        raise RequestError("experiences: expected an object with keys 'env_steps' and 'policies'")
    env_steps, policies = value["env_steps"], value["policies"]
    if isinstance(env_steps, bool) or not isinstance(env_steps, int) or env_steps < 0:
        raise RequestError(f"experiences.env_steps: {short(env_steps)} is not an int >= 0")
    if not isinstance(policies, dict) or not policies:
        raise RequestError("experiences.policies: expected an object policy_id -> columns")
    policy_batches = {}
    for pid, columns in policies.items():
        if not isinstance(pid, str) or pid not in policy_map:
            raise RequestError(f"experiences: unknown policy {short(pid)}; known: {sorted(policy_map)}")
        policy_batches[pid] = _policy_batch(pid, columns, policy_map[pid])
    return MultiAgentBatch(policy_batches, count_env_steps(policy_batches.values()))


def count_env_steps(policy_batches: Any) -> int:
    """Distinct (eps_id, t) pairs over all rows: every env step an agent observed, once."""
    pairs = [np.stack([batch["eps_id"], batch["t"]], axis=1) for batch in policy_batches]
    rows = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)
    return int(len(np.unique(rows, axis=0))) if len(rows) else 0


def _policy_batch(pid: str, columns: Any, policy: Any) -> SampleBatch:
    where = f"experiences.policies[{pid!r}]"
    if not isinstance(columns, dict):
        raise RequestError(f"{where}: expected an object column -> values")
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise RequestError(f"{where}: missing columns {missing}")
    bad_names = [short(name) for name in columns if not _safe_name(name)]
    if bad_names:
        raise RequestError(
            f"{where}: column names {bad_names} refused; expected letters, digits, '_', '.', '-' "
            "(no '/'), at most 128 characters"
        )
    rows = _num_rows(columns, where)
    batch = SampleBatch()
    for name in list(columns):
        # Popped: a JSON column's Python objects are freed once it is an array.
        batch[name] = _column(name, columns.pop(name), rows, policy, f"{where}[{name!r}]")
    return batch


def _num_rows(columns: dict, where: str) -> int:
    lengths = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray) and column.ndim > 0:
            lengths[name] = len(column)
        elif isinstance(column, list):
            lengths[name] = len(column)
        else:
            raise RequestError(f"{where}[{name!r}]: expected an array or a list, got {short(column)}")
    if len(set(lengths.values())) != 1:
        raise RequestError(f"{where}: columns differ in length: {lengths}")
    return next(iter(lengths.values()))


def _column(name: str, column: Any, rows: int, policy: Any, where: str) -> np.ndarray:
    if name in ("obs", "new_obs"):
        return _space_column(policy.observation_space, column, rows, where)
    if name == "actions":
        return _space_column(policy.action_space, column, rows, where)
    if name == "rewards":
        rewards = real_array(column, where).astype(np.float64)
        if rewards.shape != (rows,):
            raise RequestError(f"{where}: expected one reward per row, got shape {rewards.shape}")
        refuse_first(~np.isfinite(rewards), rewards, where, "")
        refuse_first(np.abs(rewards) > FLOAT32_MAX, rewards, where, ", too large for float32")
        return rewards.astype(np.float32)
    if name == "infos":
        infos = np.empty(rows, object)
        infos[:] = [_info(info, f"{where} row {i}") for i, info in enumerate(column)]
        return infos
    if name == SampleBatch.AGENT_ID:
        return _agent_ids(column, where)
    array = real_array(column, where)
    if array.ndim == 0 or len(array) != rows:
        raise RequestError(f"{where}: expected {rows} rows, got shape {array.shape}")
    if name in _FLAG_COLUMNS:
        if array.shape != (rows,):
            raise RequestError(f"{where}: expected one flag per row, got shape {array.shape}")
        refuse_first((array != 0) & (array != 1), array, where, ", expected true/false")
        return array.astype(bool)
    if name in _INTEGER_COLUMNS:
        if array.shape != (rows,) or array.dtype.kind not in "iu":
            raise RequestError(f"{where}: expected one integer per row, got {array.dtype} {array.shape}")
        return array.astype(np.int64)
    return array


def _space_column(space: gym.Space, column: Any, rows: int, where: str) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        array = real_array(column, where)
        box = gym.spaces.Box(int(space.start), int(space.start) + int(space.n) - 1, (), np.int64)
        return space_array(box, array, where, rows=rows)
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return space_array(space, column, where, rows=rows)
    raise RequestError(f"{where}: uploads of {space} values are not supported")


def _agent_ids(column: Any, where: str) -> np.ndarray:
    """A list of agent ids (strings of at most MAX_AGENT_ID_CHARS, UTF-8 encodable) as a
    string array, as the runner's batches carry them."""
    if not isinstance(column, list):
        raise RequestError(f"{where}: expected a list of strings, got {short(column)}")
    for i, agent_id in enumerate(column):
        if not isinstance(agent_id, str) or len(agent_id) > MAX_AGENT_ID_CHARS:
            raise RequestError(
                f"{where} row {i}: expected a string of at most {MAX_AGENT_ID_CHARS} characters, "
                f"got {short(agent_id)}"
            )
        try:
            agent_id.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(f"{where} row {i}: {short(agent_id)} is not valid Unicode") from None
    return np.array(column, dtype=str)


def _info(info: Any, where: str) -> dict:
    if not isinstance(info, dict):
        raise RequestError(f"{where}: expected an object, got {short(info)}")
    return json_safe(info, where)


def _safe_name(name: Any) -> bool:
    return isinstance(name, str) and COLUMN_NAME.fullmatch(name) is not None
