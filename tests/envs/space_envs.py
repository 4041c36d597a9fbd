"""Envs with the observation/action spaces a policy has to handle.

Each checks the actions it gets, so a policy that ignores a mask or leaves
its action space fails loudly instead of training on garbage.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.bench.envs.scripted_env import OBS_SPACE, ScriptedEnv, every_round_script
from marl_runner.envs.multi_agent_env import AgentID

AGENTS = ("a0", "a1")


class _MaskedActionsEnv(ScriptedEnv):
    """Draws a fresh random action mask (at least one action allowed) per obs
    and rejects actions it disallows."""

    def __init__(self, observation_space: gym.Space, num_actions: int, episode_len: int) -> None:
        super().__init__(
            every_round_script(AGENTS, episode_len),
            AGENTS,
            observation_space,
            gym.spaces.Discrete(num_actions),
        )
        self.num_actions = num_actions
        self._masks: dict[AgentID, np.ndarray] = {}

    def _draw_mask(self, agent: AgentID) -> np.ndarray:
        mask = (self._rng.random(self.num_actions) < 0.5).astype(np.int8)
        mask[self._rng.integers(self.num_actions)] = 1
        self._masks[agent] = mask
        return mask

    def _check_action(self, agent: AgentID, action: Any) -> None:
        super()._check_action(agent, action)
        if not self._masks[agent][action]:
            raise ValueError(
                f"{type(self).__name__}: {agent!r} chose action {action!r}, "
                f"which its mask {self._masks[agent].tolist()} forbids"
            )


class DictObsEnv(_MaskedActionsEnv):
    """Dict obs `{"observation": Box(3,), "action_mask": Box(0, 1, (A,), int8)}`,
    the layout of PettingZoo's classic games."""

    def __init__(self, num_actions: int = 4, episode_len: int = 5) -> None:
        space = gym.spaces.Dict(
            {
                "observation": OBS_SPACE,
                "action_mask": gym.spaces.Box(0, 1, (num_actions,), np.int8),
            }
        )
        super().__init__(space, num_actions, episode_len)

    def _observation(self, agent: AgentID) -> Any:
        return {"observation": super()._observation(agent), "action_mask": self._draw_mask(agent)}


class MaskInfoEnv(_MaskedActionsEnv):
    """Box obs with the action mask in `infos[agent]["action_mask"]`."""

    def __init__(self, num_actions: int = 4, episode_len: int = 5) -> None:
        super().__init__(OBS_SPACE, num_actions, episode_len)

    def _info(self, agent: AgentID) -> dict[str, Any]:
        return {"action_mask": self._draw_mask(agent)}


class BoxActionEnv(ScriptedEnv):
    """Continuous actions in Box(-1, 1, (2,)); rejects any outside the box.

    Only shape and bounds are checked, not the dtype, so float64 actions
    from a policy are accepted (gymnasium's `Box.contains` would reject them).
    """

    def __init__(self, episode_len: int = 5) -> None:
        super().__init__(
            every_round_script(AGENTS, episode_len),
            AGENTS,
            action_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        )

    def _check_action(self, agent: AgentID, action: Any) -> None:
        space = self.get_action_space(agent)
        value = np.asarray(action)
        if value.shape != space.shape or not np.all((value >= space.low) & (value <= space.high)):
            raise ValueError(f"BoxActionEnv: action {action!r} of {agent!r} is not in {space}")


class MultiDiscreteEnv(ScriptedEnv):
    """MultiDiscrete([3, 4]) actions; rejects wrong shapes, floats, out-of-range values."""

    def __init__(self, episode_len: int = 5) -> None:
        super().__init__(
            every_round_script(AGENTS, episode_len),
            AGENTS,
            action_space=gym.spaces.MultiDiscrete([3, 4]),
        )

    def _check_action(self, agent: AgentID, action: Any) -> None:
        space = self.get_action_space(agent)
        value = np.asarray(action)
        if (
            value.shape != space.shape
            or not np.issubdtype(value.dtype, np.integer)
            or not np.all((value >= 0) & (value < space.nvec))
        ):
            raise ValueError(f"MultiDiscreteEnv: action {action!r} of {agent!r} is not in {space}")


class TupleActionEnv(ScriptedEnv):
    """Tuple(Discrete(2), Discrete(3)) actions, which no built-in policy draws (a custom
    policy's); rejects any action that is not a pair in the space."""

    def __init__(self, episode_len: int = 5) -> None:
        super().__init__(
            every_round_script(AGENTS, episode_len),
            AGENTS,
            action_space=gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))),
        )

    def _check_action(self, agent: AgentID, action: Any) -> None:
        space = self.get_action_space(agent)
        if not (isinstance(action, tuple) and len(action) == 2 and space.contains(
            tuple(np.int64(part) for part in action)
        )):
            raise ValueError(f"TupleActionEnv: action {action!r} of {agent!r} is not in {space}")


class ListPairActionEnv(TupleActionEnv):
    """TupleActionEnv that takes a list pair too (as ``gym.spaces.Tuple.contains`` does):
    a policy returning its parts as a list sends lists."""

    def _check_action(self, agent: AgentID, action: Any) -> None:
        super()._check_action(agent, tuple(action) if isinstance(action, list) else action)
