"""MalformedEnv: breaks the MultiAgentEnv contract in one chosen way."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs.multi_agent_env import MultiAgentDict, MultiAgentEnv

_GOOD_STEP: tuple[Any, ...] = (
    {"a0": 0},
    {"a0": 0.0},
    {"a0": False, "__all__": False},
    {"a0": False, "__all__": False},
    {"a0": {}},
)
_DEFECTS: dict[str, Any] = {
    "none": _GOOD_STEP,
    "four_values": _GOOD_STEP[:4],
    "not_a_tuple": None,
    "obs_not_dict": (["a0"], *_GOOD_STEP[1:]),
    "no_all_terminated": (*_GOOD_STEP[:2], {"a0": False}, *_GOOD_STEP[3:]),
    "no_all_truncated": (*_GOOD_STEP[:3], {"a0": False}, _GOOD_STEP[4]),
    "nan_reward": (_GOOD_STEP[0], {"a0": float("nan")}, *_GOOD_STEP[2:]),
    "inf_reward": (_GOOD_STEP[0], {"a0": float("-inf")}, *_GOOD_STEP[2:]),
    # Finite, but past float32 (the batch's reward column would hold inf).
    "huge_reward": (_GOOD_STEP[0], {"a0": 1e300}, *_GOOD_STEP[2:]),
    "int_past_float_reward": (_GOOD_STEP[0], {"a0": 10**400}, *_GOOD_STEP[2:]),
    "complex_reward": (_GOOD_STEP[0], {"a0": 1j}, *_GOOD_STEP[2:]),
    "undeclared_obs": ({"a0": 0, "ghost": 0}, *_GOOD_STEP[1:]),
    "undeclared_reward": (_GOOD_STEP[0], {"a0": 0.0, "ghost": 1.0}, *_GOOD_STEP[2:]),
    "undeclared_flag": (
        *_GOOD_STEP[:2],
        {"a0": False, "ghost": True, "__all__": False},
        *_GOOD_STEP[3:],
    ),
    "obs_out_of_space": ({"a0": 7}, *_GOOD_STEP[1:]),
    "obs_object_array": ({"a0": np.array([object()] * 2)}, *_GOOD_STEP[1:]),
}
RESET_DEFECTS = ("reset_obs_only",)


class MalformedEnv(MultiAgentEnv):
    """One agent `a0`; reset and step return data with the named `defect`.

    Step defects: `four_values`, `not_a_tuple`, `obs_not_dict`,
    `no_all_terminated`, `no_all_truncated`, `nan_reward`, `inf_reward`, `huge_reward`,
    `int_past_float_reward`, `complex_reward`,
    `undeclared_obs` / `undeclared_reward` / `undeclared_flag` (for agent
    `ghost`, which has no space), `obs_out_of_space` (obs 7 for a
    `Discrete(2)` space), `obs_object_array` (an object array there) (or `none` for
    well-formed output); reset defect:
    `reset_obs_only`. ``from_step``: the first step (1-based) with the defect, the ones
    before well-formed. For tests that a vector env or
    runner names the sub-env and what was expected. Given by name, so that
    it can be built from a config and in worker processes.
    """

    def __init__(self, defect: str = "none", from_step: int = 1) -> None:
        if defect not in _DEFECTS and defect not in RESET_DEFECTS:
            raise ValueError(
                f"MalformedEnv defect {defect!r}: expected one of {[*_DEFECTS, *RESET_DEFECTS]}"
            )
        self.defect = defect
        self.from_step = from_step
        self.steps = 0
        self.possible_agents = ["a0"]
        self.observation_spaces = {"a0": gym.spaces.Discrete(2)}
        self.action_spaces = {"a0": gym.spaces.Discrete(2)}

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        if self.defect == "reset_obs_only":
            return ({"a0": 0},)  # type: ignore[return-value]
        return {"a0": 0}, {"a0": {}}

    def step(self, actions: MultiAgentDict) -> Any:
        self.steps += 1
        if self.steps < self.from_step:
            return _GOOD_STEP
        return _DEFECTS.get(self.defect, _GOOD_STEP)
