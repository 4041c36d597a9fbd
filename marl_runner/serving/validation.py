"""Untrusted call values checked and converted before they reach the env or the runner.

A bad value from a client must be a 400 for that request, never an exception
in the runner's loop (it would stop the server for everyone) nor a value that
poisons shared state (a NaN in an observation filter). Values are converted
to each agent's space. The server runs `CallValues` on every request, a
client at every call: a value the server would refuse raises where it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.config.spaces import space_from_spec
from marl_runner.envs.external_env import ExternalMultiAgentEnv
from marl_runner.serving.value_checks import (
    ACTION_MASK,
    FLOAT32_MAX,
    RequestError,
    check_action_mask,
    finite_reward,
    json_safe,
    real_array,
    refuse_first,
    short,
    space_array,
    to_space,
)

__all__ = [
    "CallValues",
    "RequestError",
    "add_rewards",
    "checks_of_info",
    "episode_id_of",
    "filter_deltas_of",
    "to_space",
]

MAX_ID_LENGTH = 256
MAX_FILTER_COUNT = 2**53  # counts beyond this lose precision in the float64 merge
# How each body field is named in messages.
_FIELD_NAMES = {"obs": "observation", "actions": "action"}


def episode_id_of(body: dict, *, required: bool = True) -> Any:
    """`body["episode_id"]`: a non-empty string of at most `MAX_ID_LENGTH` characters."""
    value = body.get("episode_id")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise RequestError(f"episode_id {short(value)}: expected a string of 1..{MAX_ID_LENGTH} chars")
    return value


class CallValues:
    """The values of the five calls checked against `env`'s agents and spaces (an
    `ExternalMultiAgentEnv`); each method returns them converted, or raises `RequestError`."""

    def __init__(self, env: Any) -> None:
        self.env = env

    def obs(self, obs: Any, *, allow_empty: bool = False) -> dict:
        """Observations in their agents' spaces; an `action_mask` of a Dict observation must
        allow some action."""
        return self._agent_values(obs, "obs", self.env.get_observation_space, allow_empty, True)

    def actions(self, actions: Any) -> dict:
        """Logged (off-policy) actions, each in its agent's action space."""
        return self._agent_values(actions, "actions", self.env.get_action_space, False, False)

    def rewards(self, rewards: Any) -> dict[Any, float]:
        """Finite, float32-sized rewards of known agents."""
        out = {}
        for agent, reward in _object_of(rewards, "rewards", "number").items():
            _agent_space(self.env.get_observation_space, agent, "rewards")
            out[agent] = finite_reward(reward, f"reward of agent {agent!r}")
        return out

    def infos(self, infos: Any) -> dict[Any, dict] | None:
        """JSON-safe infos of known agents (a batch file can store them; an `action_mask` must
        fit), or None."""
        if infos is None:
            return None
        out = {}
        for agent, info in _object_of(infos, "infos", "object, or null").items():
            action_space = _agent_space(self.env.get_action_space, agent, "infos")
            where = f"infos of agent {agent!r}"
            if not isinstance(info, dict):
                raise RequestError(f"{where}: expected an object, got {_kind(info)}")
            out[agent] = json_safe(info, where)
            if ACTION_MASK in out[agent]:
                check_action_mask(out[agent][ACTION_MASK], action_space, f"{where}[{ACTION_MASK!r}]")
        return out

    def returns(self, returns: Any) -> tuple[dict[Any, float], dict[Any, dict]] | None:
        """A call's `returns` field: `[[rewards, infos], ...]` logged since the episode's last
        step, as one `log_returns`: the rewards added up in order (their sums must fit the
        float32 reward column), the infos merged in order. Each pair gets `log_returns`'
        checks; None when there are none."""
        if returns is None:
            return None
        if not isinstance(returns, (list, tuple)):
            raise RequestError(f"returns: expected a list of [rewards, infos], got {_kind(returns)}")
        totals: dict[Any, float] = {}
        merged: dict[Any, dict] = {}
        for index, pair in enumerate(returns):
            where = f"returns[{index}]"
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RequestError(f"{where}: expected [rewards, infos], got {short(pair)}")
            try:
                rewards, infos = self.rewards(pair[0]), self.infos(pair[1])
            except RequestError as exc:
                raise RequestError(f"{where}: {exc}") from None
            totals = add_rewards(totals, rewards, where)
            for agent, info in (infos or {}).items():
                merged.setdefault(agent, {}).update(info)
        return (totals, merged) if returns else None

    def _agent_values(self, values: Any, key: str, space_of: Callable[[Any], gym.Space],
                      allow_empty: bool, masks: bool) -> dict:
        values = _object_of(values, key, "value")
        if not values and not allow_empty:
            raise RequestError(f"{key}: expected at least one agent")
        fast = _one_box_arrays(values, space_of)
        if fast is not None:
            return fast
        out = {}
        for agent, value in values.items():
            where = f"{_FIELD_NAMES[key]} of agent {agent!r}"
            out[agent] = to_space(_agent_space(space_of, agent, key), value, where)
            if masks and isinstance(out[agent], dict) and ACTION_MASK in out[agent]:
                check_action_mask(out[agent][ACTION_MASK], self.env.get_action_space(agent),
                                  f"{where}[{ACTION_MASK!r}]")
        return out


def checks_of_info(info: dict) -> CallValues:
    """The checks on the agents and spaces a server's `GET /v1/info` names: what a client runs
    at each call, on an `ExternalMultiAgentEnv` of those spaces, as the server does."""
    return CallValues(ExternalMultiAgentEnv(
        {a: space_from_spec(s) for a, s in info["observation_spaces"].items()},
        {a: space_from_spec(s) for a, s in info["action_spaces"].items()},
    ))


def add_rewards(totals: dict[Any, float], rewards: dict[Any, float], where: str) -> dict:
    """`totals` plus `rewards`, agent by agent, in the order the runner adds them up; refuses
    a sum beyond the float32 reward column (the runner would refuse that step)."""
    out = dict(totals)
    for agent, reward in rewards.items():
        total = out.get(agent, 0.0) + reward
        if not abs(total) <= FLOAT32_MAX:
            raise RequestError(
                f"{where}: rewards of agent {agent!r} add up to {total:g} since the last step; "
                f"expected |sum| <= {FLOAT32_MAX:.4g} (the float32 reward column)"
            )
        out[agent] = total
    return out


def _one_box_arrays(values: dict, space_of: Callable[[Any], gym.Space]) -> dict | None:
    """Agents whose values are arrays of one dtype and whose spaces are one Box, checked as
    one stacked array: the same checks as `to_space` agent by agent, in a few numpy calls
    instead of a dozen per agent. None when that does not apply or a check fails, so the
    caller checks agent by agent and its message names the agent and the entry."""
    space = dtype = None
    for agent, value in values.items():
        try:
            agent_space = space_of(agent)
        except Exception:
            return None
        if space is None:
            space, dtype = agent_space, getattr(value, "dtype", None)
        if (
            agent_space is not space or not isinstance(space, gym.spaces.Box)
            or type(value) is not np.ndarray or value.dtype != dtype
            or value.shape != space.shape
        ):
            return None
    if space is None:
        return None
    try:
        stacked = space_array(space, np.stack(list(values.values())), "", rows=len(values))
    except RequestError:
        return None
    return dict(zip(values, stacked))


def _object_of(values: Any, key: str, kind: str) -> dict:
    if not isinstance(values, dict):
        raise RequestError(f"{key}: expected an object agent_id -> {kind}, got {_kind(values)}")
    return values


def filter_deltas_of(body: dict, policy_map: dict) -> dict[tuple[str, int], dict]:
    """`[[policy_id, connector index, stats], ...]` of a local client's observation filters."""
    deltas = body.get("filter_deltas", [])
    if not isinstance(deltas, list):
        raise RequestError("filter_deltas: expected a list of [policy_id, index, stats]")
    out = {}
    for item in deltas:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], dict)):
            raise RequestError(f"filter_deltas item {short(item)}: expected [policy_id, index, stats]")
        policy_id, index, stats = item
        known = isinstance(policy_id, str) and policy_id in policy_map  # policy ids are strings
        chain = policy_map[policy_id].agent_connectors if known else None
        if (
            chain is None or isinstance(index, bool) or not isinstance(index, int)
            or not 0 <= index < len(chain) or not hasattr(chain[index], "pop_delta")
        ):
            raise RequestError(f"filter_deltas: policy {short(policy_id)} has no filter at {short(index)}")
        out[(policy_id, index)] = _filter_stats(stats, chain[index], f"filter_deltas[{policy_id!r}, {index}]")
    return out


def _filter_stats(stats: dict, connector: Any, where: str) -> dict:
    """Finite statistics shaped like the filter's: a NaN here would poison it for everyone."""
    if set(stats) != {"count", "mean", "m2"}:
        raise RequestError(f"{where}: expected the keys count, mean, m2, got {sorted(map(str, stats))}")
    count = stats["count"]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_FILTER_COUNT:
        raise RequestError(f"{where}: count {short(count)} is not an int in [0, {MAX_FILTER_COUNT}]")
    current = connector.get_state()
    shape = None if current is None else real_array(current["mean"], where).shape
    arrays = {}
    for name in ("mean", "m2"):
        array = real_array(stats[name], f"{where} {name}").astype(np.float64)
        if shape is not None and array.shape != shape:
            raise RequestError(f"{where} {name}: shape {array.shape}, expected {shape}")
        refuse_first(~np.isfinite(array), array, f"{where} {name}", "")
        arrays[name] = array
    if arrays["mean"].shape != arrays["m2"].shape:
        raise RequestError(f"{where}: mean and m2 differ in shape")
    refuse_first(arrays["m2"] < 0, arrays["m2"], f"{where} m2", ", expected >= 0")
    return {"count": count, "mean": arrays["mean"], "m2": arrays["m2"]}


def _agent_space(space_of: Callable[[Any], gym.Space], agent: Any, key: str) -> gym.Space:
    try:
        return space_of(agent)
    except Exception:
        raise RequestError(f"{key}: unknown agent {short(agent)}") from None


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
