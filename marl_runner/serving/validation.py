"""Untrusted request values checked and converted before they reach the env or the runner.

A wrong shape, dtype or agent id from a client must become a 400 for that
request, never an exception inside the runner's loop (which would stop the
server for everyone). Values are converted to each agent's space, so JSON
clients may send plain nested lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

MAX_ID_LENGTH = 256


class RequestError(ValueError):
    """A request whose content does not fit what the server expects (answered with 400)."""


def episode_id_of(body: dict, *, required: bool = True) -> Any:
    value = body.get("episode_id")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise RequestError(f"episode_id {_short(value)}: expected a string of 1..{MAX_ID_LENGTH} chars")
    return value


def agent_values(
    body: dict,
    key: str,
    space_of: Callable[[Any], gym.Space] | None,
    *,
    allow_empty: bool = False,
) -> dict[Any, Any]:
    """`body[key]` as a dict agent_id -> value converted to the agent's space."""
    values = body.get(key)
    if not isinstance(values, dict):
        raise RequestError(f"{key}: expected an object agent_id -> value, got {_kind(values)}")
    if not values and not allow_empty:
        raise RequestError(f"{key}: expected at least one agent")
    if space_of is None:
        return values
    out = {}
    for agent, value in values.items():
        try:
            space = space_of(agent)
        except Exception:
            raise RequestError(f"{key}: unknown agent {_short(agent)}") from None
        out[agent] = to_space(space, value, f"{key}[{agent!r}]")
    return out


def rewards_of(body: dict) -> dict[Any, float]:
    rewards = body.get("rewards")
    if not isinstance(rewards, dict):
        raise RequestError(f"rewards: expected an object agent_id -> number, got {_kind(rewards)}")
    out = {}
    for agent, reward in rewards.items():
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise RequestError(f"rewards[{agent!r}]: {_short(reward)} is not a finite number")
        out[agent] = float(reward)
    return out


def infos_of(body: dict) -> dict[Any, dict] | None:
    infos = body.get("infos")
    if infos is None:
        return None
    if not isinstance(infos, dict) or not all(isinstance(v, dict) for v in infos.values()):
        raise RequestError("infos: expected an object agent_id -> object, or null")
    return infos


def filter_deltas_of(body: dict, policy_map: dict) -> dict[tuple[str, int], dict]:
    """`[[policy_id, connector index, stats], ...]` of a local client's observation filters."""
    deltas = body.get("filter_deltas", [])
    if not isinstance(deltas, list):
        raise RequestError("filter_deltas: expected a list of [policy_id, index, stats]")
    out = {}
    for item in deltas:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], dict)):
            raise RequestError(f"filter_deltas item {_short(item)}: expected [policy_id, index, stats]")
        policy_id, index, stats = item
        chain = policy_map[policy_id].agent_connectors if policy_id in policy_map else None
        if (
            chain is None or isinstance(index, bool) or not isinstance(index, int)
            or not 0 <= index < len(chain) or not hasattr(chain[index], "pop_delta")
        ):
            raise RequestError(f"filter_deltas: policy {_short(policy_id)} has no filter at {_short(index)}")
        if set(stats) != {"count", "mean", "m2"}:
            raise RequestError("filter_deltas stats: expected the keys count, mean, m2")
        out[(policy_id, index)] = stats
    return out


def to_space(space: gym.Space, value: Any, where: str) -> Any:
    """`value` converted to an element of `space`; `RequestError` when it does not fit."""
    if isinstance(space, gym.spaces.Discrete):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise RequestError(f"{where}: {_short(value)} is not an integer of {space}")
        if not space.contains(np.int64(value)):
            raise RequestError(f"{where}: {value} is outside {space}")
        return int(value)
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            raise RequestError(f"{where}: expected an object with keys {sorted(space.spaces)}")
        return {k: to_space(sub, value[k], f"{where}[{k!r}]") for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(space.spaces):
            raise RequestError(f"{where}: expected a list of {len(space.spaces)} values")
        return tuple(to_space(sub, v, f"{where}[{i}]") for i, (sub, v) in enumerate(zip(space.spaces, value)))
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        try:
            array = np.asarray(value)
        except Exception:
            raise RequestError(f"{where}: not an array") from None
        if array.dtype.kind not in "biuf":
            raise RequestError(f"{where}: expected numbers, got an array of {array.dtype}")
        if array.shape != space.shape:
            raise RequestError(f"{where}: shape {array.shape}, expected {space.shape} of {space}")
        if array.dtype.kind == "f" and not isinstance(space, gym.spaces.Box):
            raise RequestError(f"{where}: expected integers for {space}")
        return array.astype(space.dtype, copy=False)
    raise RequestError(f"{where}: the server cannot check values of {space} from clients")


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
