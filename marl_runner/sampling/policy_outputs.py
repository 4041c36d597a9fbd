"""From a policy's output to env-bound actions per sub-env and the columns stored for training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import tree

from connectors.data import META_COLUMNS, ActionRows, AgentRows
from marl_runner.sampling.trajectories import KEY_COLUMN

if TYPE_CHECKING:
    from marl_runner.policy import PolicyOutput
    from marl_runner.policy_setup import PolicyEntry


class Evaluated(NamedTuple):
    """One policy's forward pass of a round: which of its rows needed an action, those
    rows, and the policy's output for them."""

    needs_action: np.ndarray
    input_rows: AgentRows
    output: PolicyOutput


def run_action_connectors(
    entry: PolicyEntry,
    evaluated: Evaluated,
    num_rows: int,
    off_policy: dict[int, dict],
    actions_by_env: dict[int, dict],
) -> dict[str, np.ndarray]:
    """The policy's action pipeline; its env actions go to ``actions_by_env``.

    Returns the action-side columns stored over all ``num_rows`` rows of the
    round: the raw policy output (or the env's own choice where it acted
    off-policy) and the extra outputs. Stateful agent connectors (previous
    action, RNN state) are told what was stored.
    """
    needs_action, input_rows, (actions, state_outs, extra) = evaluated
    action_rows = ActionRows(
        actions=actions, state_outs=state_outs, extra=extra,
        keys=input_rows["keys"], env_ids=input_rows["env_ids"],
        agent_ids=input_rows["agent_ids"], input_rows=input_rows,
    )
    distribute_actions(actions_by_env, input_rows, entry.action_pipeline(action_rows).actions)
    columns = {"actions": actions, **extra}
    for i, state in enumerate(state_outs):
        columns[f"state_out_{i}"] = state
    if off_policy:
        apply_off_policy_actions(columns, input_rows, off_policy)
        action_rows = action_rows.replace(actions=columns["actions"])
    entry.agent_pipeline.on_policy_output(action_rows)
    return scatter(columns, needs_action, num_rows)


def stored_columns(rows: AgentRows) -> dict[str, Any]:
    """What the trajectory store keeps of a round: the data columns, plus the trajectory
    key and time index of each row and its infos (as one object column)."""
    chunk: dict[str, Any] = {KEY_COLUMN: rows["keys"], "t": rows["t"]}
    for name, column in rows.columns.items():
        if name in META_COLUMNS:
            continue
        chunk[name] = column if isinstance(column, np.ndarray) else np.asarray(column)
    # fromiter stores each info as it is, ~5x faster than `empty[:] = infos` (which checks
    # every element for a nested sequence, and would even split equal-length sequences).
    chunk["infos"] = np.fromiter(rows["infos"], object, len(rows))
    return chunk


def scatter(columns: dict[str, Any], needs_action: np.ndarray, num_rows: int) -> dict[str, np.ndarray]:
    """Action-side columns over all rows of the round (zeros on done rows)."""
    if len(needs_action) == num_rows and needs_action.all():
        return {name: _as_column(value, num_rows) for name, value in columns.items()}
    acting = np.flatnonzero(needs_action)
    out = {}
    for name, value in columns.items():
        value = _as_column(value, len(acting))
        full = np.zeros((num_rows,) + value.shape[1:], value.dtype)
        full[acting] = value
        out[name] = full
    return out


def _as_column(value: Any, num_rows: int) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)) and len(value) == num_rows:
        return np.asarray(value)
    # Nested action structures are stored one structure per row.
    rows = np.empty(num_rows, object)
    rows[:] = _split_rows(value, num_rows)
    return rows


def _split_rows(actions: Any, num_rows: int) -> list:
    """Per-row values of an action batch: plain Python ints for Discrete, views otherwise."""
    if isinstance(actions, np.ndarray):
        return actions.tolist() if actions.ndim == 1 else list(actions)
    flat = tree.flatten(actions)
    return [tree.unflatten_as(actions, [leaf[i] for leaf in flat]) for i in range(num_rows)]


def distribute_actions(actions_by_env: dict[int, dict], rows: AgentRows, actions: Any) -> None:
    """Each row's env-bound action into ``actions_by_env[env_id][agent_id]``."""
    per_row = _split_rows(actions, len(rows))
    for env_id, agent_id, action in zip(rows["env_ids"].tolist(), rows["agent_ids"], per_row):
        actions_by_env[env_id][agent_id] = action


def apply_off_policy_actions(columns: dict[str, Any], rows: AgentRows, off_policy: dict) -> None:
    """The env chose some actions itself: store those, not the policy's."""
    actions = columns["actions"]
    if not isinstance(actions, np.ndarray):
        return
    actions = columns["actions"] = actions.copy()
    for i, (env_id, agent_id) in enumerate(zip(rows["env_ids"].tolist(), rows["agent_ids"])):
        env_actions = off_policy.get(env_id)
        if env_actions and agent_id in env_actions:
            actions[i] = env_actions[agent_id]
