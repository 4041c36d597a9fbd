"""CheapEnv: the benchmark env, as close to free per step as Python allows."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv, StepResult


class CheapEnv(MultiAgentEnv):
    """N agents that all act every round for a fixed number of rounds.

    Obs are 16-dim float32 rows of a read-only table drawn at reset (so a
    runner may keep them without copying); column 0 is `t / episode_len` and
    column 1 is `agent_index / num_agents`, so every obs differs from the
    previous one and from the other agents'. Rewards are drawn at reset too.
    Actions (Discrete(5)) are ignored: the env exists to measure the runner.
    The last round truncates every agent (a time limit, `"__all__"`
    truncated). Flag and info dicts are shared between steps: read-only.

    Deterministic given the reset seed; unseeded resets continue the RNG.
    `reward_log` lists each episode's reward totals per agent.
    """

    def __init__(
        self, num_agents: int = 8, episode_len: int = 100, obs_dim: int = 16, num_actions: int = 5
    ) -> None:
        if num_agents < 1 or episode_len < 1 or obs_dim < 2:
            raise ValueError("CheapEnv needs num_agents >= 1, episode_len >= 1, obs_dim >= 2")
        self.num_agents = num_agents
        self.episode_len = episode_len
        self.obs_dim = obs_dim
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        obs_space = gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        action_space = gym.spaces.Discrete(num_actions)
        self.observation_spaces = dict.fromkeys(self.possible_agents, obs_space)
        self.action_spaces = dict.fromkeys(self.possible_agents, action_space)
        self._rng = np.random.default_rng()
        self._running_terminateds = {**dict.fromkeys(self.possible_agents, False), "__all__": False}
        self._running_truncateds = dict(self._running_terminateds)
        self._final_truncateds = {**dict.fromkeys(self.possible_agents, True), "__all__": True}
        self._infos: MultiAgentDict = {agent: {} for agent in self.possible_agents}
        self._past_reward_totals: list[dict[AgentID, float]] = []
        self._obs_table = np.zeros((0, num_agents, obs_dim), np.float32)
        self._reward_table = np.zeros((0, num_agents), np.float32)
        self._reward_rows: list[list[float]] = []
        self._t = 0

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if len(self._reward_table):
            self._past_reward_totals.append(self._reward_totals())
        steps, agents = self.episode_len, self.num_agents
        table = self._rng.random((steps + 1, agents, self.obs_dim), np.float32) * 2 - 1
        table[:, :, 0] = np.arange(steps + 1, dtype=np.float32)[:, None] / steps
        table[:, :, 1] = np.arange(agents, dtype=np.float32)[None, :] / agents
        table.flags.writeable = False
        self._obs_table = table
        self._reward_table = self._rng.random((steps, agents), np.float32) * 2 - 1
        self._reward_rows = self._reward_table.tolist()
        self._t = 0
        return dict(zip(self.possible_agents, table[0])), self._infos

    def step(self, actions: MultiAgentDict) -> StepResult:
        t = self._t = self._t + 1
        if t > self.episode_len:
            raise RuntimeError(f"CheapEnv stepped after its {self.episode_len}-round episode ended")
        agents = self.possible_agents
        obs = dict(zip(agents, self._obs_table[t]))
        rewards = dict(zip(agents, self._reward_rows[t - 1]))
        if t < self.episode_len:
            return obs, rewards, self._running_terminateds, self._running_truncateds, self._infos
        return obs, rewards, self._running_terminateds, self._final_truncateds, self._infos

    @property
    def reward_log(self) -> list[dict[AgentID, float]]:
        """Reward totals per agent of every episode, the current one last.

        Computed on demand from the reward table, which keeps `step` free of
        bookkeeping.
        """
        current = [self._reward_totals()] if len(self._reward_table) else []
        return [*self._past_reward_totals, *current]

    def _reward_totals(self) -> dict[AgentID, float]:
        given = self._reward_table[: self._t].sum(axis=0, dtype=np.float64)
        return dict(zip(self.possible_agents, given.tolist()))
