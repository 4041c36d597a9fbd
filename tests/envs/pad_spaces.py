"""PadSpacesWrapper: one fixed space for envs whose agents' spaces differ."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.bench.envs.reward_log import RewardLog
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv, StepResult


class PadSpacesWrapper(RewardLog, MultiAgentEnv):
    """Zero-pads Box obs to `(obs_size,)` and Discrete actions to `num_actions`.

    Made for PettingZoo's generated-agents fixtures, whose agent types draw
    obs sizes in [10, 50) and action counts in [3, 10) anew each episode, so
    that one policy can serve every agent. The padded action mask (zeros for
    padding actions; all real actions allowed when the env gives no mask)
    goes where the env keeps its mask: `obs["action_mask"]` when obs are
    dicts, else `info["action_mask"]`. A mask that allows nothing (the
    fixture with masks in obs draws them at random) is passed on as allowing
    every real action, since a policy cannot choose from an empty mask; the
    env then judges the move. Padding actions are rejected.
    `reward_log` records the rewards passed through.
    """

    def __init__(self, env: MultiAgentEnv, obs_size: int = 50, num_actions: int = 10) -> None:
        self.env = env
        self.obs_size = obs_size
        self.num_actions = num_actions
        self.possible_agents = list(env.possible_agents)
        self.observation_spaces = {a: self.get_observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: self.get_action_space(a) for a in self.possible_agents}
        self.reward_log = []

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        """Padded Dict space if the env's is a Dict, else the padded Box."""
        box = gym.spaces.Box(0.0, 1.0, (self.obs_size,), np.float32)
        if isinstance(self.env.get_observation_space(agent), gym.spaces.Dict):
            mask = gym.spaces.Box(0, 1, (self.num_actions,), np.int8)
            return gym.spaces.Dict({"observation": box, "action_mask": mask})
        return box

    def get_action_space(self, agent: AgentID) -> gym.Space:
        return gym.spaces.Discrete(self.num_actions)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        self._start_reward_episode()
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._pad(obs, infos)

    def step(self, actions: MultiAgentDict) -> StepResult:
        for agent, action in actions.items():
            real_actions = self.env.get_action_space(agent).n
            if not 0 <= action < real_actions:
                raise ValueError(
                    f"PadSpacesWrapper: {agent!r} chose padding action {action!r}; "
                    f"it has only {real_actions} real actions"
                )
        obs, rewards, terminateds, truncateds, infos = self.env.step(actions)
        obs, infos = self._pad(obs, infos)
        return obs, self._hand_out(rewards), terminateds, truncateds, infos

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def _pad(
        self, obs: MultiAgentDict, infos: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        padded_obs: MultiAgentDict = {}
        padded_infos: MultiAgentDict = {}
        for agent, agent_obs in obs.items():
            info = infos.get(agent, {})
            real_actions = self.env.get_action_space(agent).n
            all_real = np.ones(real_actions, np.int8)
            if isinstance(agent_obs, dict):
                real_mask = agent_obs["action_mask"]
                padded_obs[agent] = {
                    "observation": self._pad_vector(
                        agent_obs["observation"], self.obs_size, np.float32
                    ),
                    "action_mask": self._pad_vector(
                        real_mask if real_mask.any() else all_real, self.num_actions, np.int8
                    ),
                }
                padded_infos[agent] = info
            else:
                real_mask = info.get("action_mask", all_real)
                padded_obs[agent] = self._pad_vector(agent_obs, self.obs_size, np.float32)
                padded_infos[agent] = {
                    **info,
                    "action_mask": self._pad_vector(
                        real_mask if real_mask.any() else all_real, self.num_actions, np.int8
                    ),
                }
        return padded_obs, padded_infos

    @staticmethod
    def _pad_vector(values: Any, size: int, dtype: type) -> np.ndarray:
        values = np.asarray(values)
        if values.shape[0] > size:
            raise ValueError(
                f"PadSpacesWrapper: a vector of {values.shape[0]} does not fit in {size}"
            )
        padded = np.zeros(size, dtype)
        padded[: values.shape[0]] = values
        return padded
