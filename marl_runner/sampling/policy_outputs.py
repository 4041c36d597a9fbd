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
    """One policy's forward pass of a round: the rows that needed an action (indices, or
    None when all did: the usual round, with nothing to select), the rows as the policy
    got them (all of them, see ``policy_input``), and its output for them."""

    acting: np.ndarray | None
    rows: AgentRows
    output: PolicyOutput


def refuse_nan_outputs(policy_id: str, evaluated: Evaluated) -> Evaluated:
    """``evaluated``, unless the log-probs or value predictions of a row that acts are NaN:
    a NaN model output draws the first action (argmax) and stores NaN for training, so it
    is an error naming the policy and the row's sub-env and agent."""
    acting, rows, (_, _, extra) = evaluated
    for name in ("action_logp", "vf_preds"):
        nan_rows = _nan_rows(extra.get(name))
        if nan_rows is not None and acting is not None:
            nan_rows = nan_rows[np.isin(nan_rows, acting)]
        if nan_rows is not None and len(nan_rows):
            raise _nan_error(policy_id, name, nan_rows, rows, _NAN_OUTPUT)
    return evaluated


def refuse_nan_final_obs(policy_id: str, rows: AgentRows, acting: np.ndarray) -> None:
    """Rows that are done (not ``acting``) hold their agent's final obs, which the batch
    hands out as ``new_obs`` and GAE bootstraps from: one with NaN is an error, whatever
    else the round holds (the model's outputs on it are not read)."""
    obs = rows.get("obs")
    if type(obs) is not np.ndarray or obs.dtype.kind not in "fc":
        return
    final = np.ones(len(obs), bool)
    final[acting] = False
    nan_rows = _nan_rows(obs[final])
    if nan_rows is not None:
        nan_rows = np.flatnonzero(final)[nan_rows]
        raise _nan_error(policy_id, "the final obs", nan_rows, rows, _NAN_OBS)


def _nan_rows(column: Any) -> np.ndarray | None:
    """The rows of a float column holding a NaN, or None (no NaN, or not such a column: a
    custom policy's column may be of objects, or hold several values per row)."""
    if (
        type(column) is not np.ndarray
        or column.dtype.kind not in "fc"
        or not column.ndim
        or not np.isnan(column).any()
    ):
        return None
    return np.flatnonzero(np.isnan(column).reshape(len(column), -1).any(axis=1))


_NAN_OBS = (
    "the env gave an obs with NaN, or an agent connector made one (check_env_outputs: true "
    "names the env's as they arrive)"
)
_NAN_OUTPUT = (
    "the model's weights are NaN (a diverged run), or its input is (an env obs with NaN: "
    "check_env_outputs: true names it as it arrives)"
)


def _nan_error(
    policy_id: str, name: str, nan_rows: np.ndarray, rows: AgentRows, cause: str
) -> ValueError:
    row = int(nan_rows[0])
    return ValueError(
        f"policy {policy_id!r}: {name} is NaN on {len(nan_rows)} of its {len(rows)} rows, "
        f"the first one of sub-env {int(rows['env_ids'][row])}, agent "
        f"{rows['agent_ids'][row]!r}: {cause}; no action is drawn from NaN, and no NaN obs "
        "goes into a batch"
    )


def policy_input(rows: AgentRows) -> tuple[np.ndarray | None, AgentRows]:
    """The indices of the rows that need an action (not done; None when every row does,
    the usual round), and the rows as the policy gets them: a done row's action mask
    allows every action (a final obs may allow none, which no policy can honour; its
    action is never sent)."""
    done = rows["terminateds"] | rows["truncateds"]
    if not np.count_nonzero(done):  # a direct C call: ~3x faster than done.any() here
        return None, rows
    acting = np.flatnonzero(~done)
    mask = rows.get("action_mask")
    if mask is None or not len(acting):
        return acting, rows
    opened = np.array(mask)  # a copy: the stored rows keep the env's mask
    opened[done] = 1
    unmasked = AgentRows(rows.columns)
    unmasked["action_mask"] = opened
    return acting, unmasked


def run_action_connectors(
    entry: PolicyEntry,
    evaluated: Evaluated,
    off_policy: dict[int, dict],
    actions_by_env: dict[int, dict],
) -> dict[str, np.ndarray]:
    """The policy's action pipeline; the env actions of the rows that need one go to
    ``actions_by_env``.

    Returns the action-side columns stored with the rows: the raw policy
    output (or the env's own choice where it acted off-policy) and the extra
    outputs. Stateful agent connectors (previous action, RNN state) are told
    what was stored.
    """
    acting, rows, (actions, state_outs, extra) = evaluated
    action_rows = ActionRows(
        actions=actions, state_outs=state_outs, extra=extra,
        keys=rows["keys"], env_ids=rows["env_ids"],
        agent_ids=rows["agent_ids"], input_rows=rows,
    )
    env_actions = entry.action_pipeline(action_rows).actions
    distribute_actions(actions_by_env, rows, env_actions, acting)
    columns = {"actions": actions, **extra}
    for i, state in enumerate(state_outs):
        columns[f"state_out_{i}"] = state
    if off_policy:
        apply_off_policy_actions(columns, rows, off_policy, entry)
        action_rows = action_rows.replace(actions=columns["actions"])
    entry.agent_pipeline.on_policy_output(action_rows)
    num_rows = len(rows)
    return {
        name: _as_column(value, num_rows, entry.policy_id, name) for name, value in columns.items()
    }


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


def _as_column(value: Any, num_rows: int, policy_id: str, name: str) -> np.ndarray:
    """A policy output as one column: an array as it is, a nested structure of batched
    arrays (a tuple, list or dict of them, as for a Tuple action space) as one structure
    per row, and a sequence of per-row values stacked."""
    if isinstance(value, np.ndarray):
        return value
    if _is_batched_structure(value, num_rows):
        rows = np.empty(num_rows, object)
        rows[:] = _structure_rows(value, num_rows)
        return rows
    if isinstance(value, list | tuple) and len(value) == num_rows:
        return np.asarray(value)
    raise ValueError(
        f"policy {policy_id!r}: its output {name!r} is {_describe(value)}; expected one value "
        f"per row of the {num_rows}: an array [{num_rows}, ...], a tuple or dict of such "
        "arrays, or a list of the per-row values"
    )


def _is_batched_structure(value: Any, num_rows: int) -> bool:
    """Whether `value` is a tuple, list or dict whose every leaf is an array with a row
    per agent (not a sequence of per-row values, whose leaves are scalars)."""
    if not isinstance(value, tuple | list | dict):
        return False
    leaves = tree.flatten(value)
    return bool(leaves) and all(
        type(leaf) is np.ndarray and leaf.ndim and len(leaf) == num_rows for leaf in leaves
    )


def _describe(value: Any) -> str:
    length = f" of {len(value)}" if isinstance(value, list | tuple | dict) else ""
    return f"a {type(value).__name__}{length}"


def _split_rows(actions: Any, num_rows: int) -> list:
    """Per-row values of an action batch: plain Python ints for Discrete, views otherwise;
    one structure per row of a structure of batched arrays; a list of per-row values as
    it is."""
    if isinstance(actions, np.ndarray):
        return actions.tolist() if actions.ndim == 1 else list(actions)
    if not _is_batched_structure(actions, num_rows) and isinstance(actions, list | tuple):
        return list(actions)
    return _structure_rows(actions, num_rows)


def _structure_rows(structure: Any, num_rows: int) -> list:
    """One structure per row of a structure of batched arrays."""
    flat = tree.flatten(structure)
    return [tree.unflatten_as(structure, [leaf[i] for leaf in flat]) for i in range(num_rows)]


def distribute_actions(
    actions_by_env: dict[int, dict], rows: AgentRows, actions: Any, acting: np.ndarray | None
) -> None:
    """Each row's env-bound action into ``actions_by_env[env_id][agent_id]``, for the rows
    that need one (``acting``; None: all)."""
    env_ids, agent_ids = rows["env_ids"], rows["agent_ids"]
    if acting is not None and isinstance(actions, np.ndarray) and isinstance(agent_ids, np.ndarray):
        # Done rows among them: three takes, no per-row Python work.
        per_row = _split_rows(actions[acting], len(acting))
        env_ids, agent_ids = env_ids[acting].tolist(), agent_ids[acting].tolist()
    else:
        per_row = _split_rows(actions, len(rows))
        env_ids = env_ids.tolist()
        if acting is not None:
            acting = acting.tolist()
            per_row = [per_row[i] for i in acting]
            env_ids = [env_ids[i] for i in acting]
            agent_ids = [agent_ids[i] for i in acting]
    for env_id, agent_id, action in zip(env_ids, agent_ids, per_row):
        actions_by_env[env_id][agent_id] = action


def apply_off_policy_actions(
    columns: dict[str, Any], rows: AgentRows, off_policy: dict, entry: PolicyEntry
) -> None:
    """The env chose some actions itself (an external env's ``log_action``): store those,
    with their log-prob under the policy (``Policy.score_logged_actions``) in place of the
    policy's own action's, so that a trainer's ratio against ``action_logp`` holds on those
    rows too (a policy that cannot score them gets NaN there: unknown, never wrong)."""
    env_ids, agent_ids = rows["env_ids"].tolist(), rows["agent_ids"]
    logged = [
        i for i, (env_id, agent_id) in enumerate(zip(env_ids, agent_ids))
        if agent_id in off_policy.get(env_id, ())
    ]
    if not logged:
        return
    actions = columns["actions"]
    if not isinstance(actions, np.ndarray):
        raise ValueError(
            f"policy {entry.policy_id!r}: the env logged actions of its own (log_action), but "
            f"the policy's actions are a {type(actions).__name__}, not one array: storing "
            "logged actions needs a policy whose actions are one array"
        )
    actions = columns["actions"] = actions.copy()
    for i in logged:
        actions[i] = off_policy[env_ids[i]][agent_ids[i]]
    if "action_logp" not in columns:
        return
    at = np.array(logged, np.intp)
    scored = entry.policy.score_logged_actions(columns, at, actions[at])
    logp = columns["action_logp"] = np.array(columns["action_logp"], np.float32)
    logp[at] = np.nan if scored is None else scored
