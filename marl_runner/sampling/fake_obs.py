"""The observation given to an agent whose episode ended while it had no obs of its own."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs.owned_copies import owned_copy


def fake_final_obs(space: gym.Space, mode: str, last_obs: Any = None) -> Any:
    """``zeros`` (default), ``sample`` (RLlib's choice) or ``last`` (the agent's last obs),
    always in the policy's original (pre-connector) observation space."""
    if mode == "last":
        return last_obs
    if mode == "sample":
        return space.sample()
    return zeros_like_space(space)


def kept_copies(obs: dict) -> dict:
    """Each agent's obs as the env gave it, for ``last`` mode: arrays copied and dicts
    and tuples rebuilt, so that a connector changing the round's obs in place (or the env
    reusing its arrays) cannot change it."""
    return {agent_id: owned_copy(value) for agent_id, value in obs.items()}


def zeros_like_space(space: gym.Space) -> Any:
    """An all-zero value of ``space`` (the default fake final obs)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: zeros_like_space(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(zeros_like_space(s) for s in space.spaces)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.zeros(space.shape, space.dtype)
    return np.zeros(space.shape, space.dtype)
