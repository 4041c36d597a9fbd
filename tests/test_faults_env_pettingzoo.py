"""A PettingZoo ParallelEnv that never empties `agents` still gets its episodes ended."""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import ParallelEnv

from marl_runner import EnvRunner
from marl_runner.envs import ParallelPettingZooEnv, register_env
from tests.runner_helpers import config

EPISODE_LEN = 5


class KeepsAgentsEnv(ParallelEnv):
    """Two agents; at step 5 both are truncated but stay in `self.agents`.

    a1 terminates early (step 3) and stays listed too.
    """

    metadata = {"name": "keeps_agents_v0"}

    def __init__(self) -> None:
        self.possible_agents = ["a0", "a1"]
        self.agents = list(self.possible_agents)
        self._steps = 0

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self._steps = 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self._steps += 1
        live = [a for a in ("a0", "a1") if a in actions]
        obs = {a: np.full(2, self._steps / 10, np.float32) for a in live}
        rewards = dict.fromkeys(live, 1.0)
        terminated = {a: a == "a1" and self._steps == 3 for a in live}
        truncated = {a: self._steps == EPISODE_LEN for a in live}
        return obs, rewards, terminated, truncated, {a: {} for a in live}


def test_the_wrapper_ends_the_episode_when_every_listed_agent_is_done(caplog):
    env = ParallelPettingZooEnv(KeepsAgentsEnv())
    obs, _ = env.reset(seed=0)
    live = set(obs)
    with caplog.at_level(logging.WARNING):
        for step in range(1, EPISODE_LEN + 1):
            obs, rewards, terminateds, truncateds, _ = env.step(dict.fromkeys(live, 0))
            live = {a for a in obs if not (terminateds[a] or truncateds[a])}
            over = step == EPISODE_LEN
            assert terminateds["__all__"] is False
            assert truncateds["__all__"] is over, step
        assert env.step({}) == ({}, {}, {"__all__": False}, {"__all__": False}, {})
    warnings = [r for r in caplog.records if "keeps terminated/truncated agents" in r.message]
    assert len(warnings) == 1
    obs, _ = env.reset()  # a new episode starts afresh
    assert set(obs) == {"a0", "a1"}
    assert env.step({"a0": 0, "a1": 0})[3]["__all__"] is False


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_runner_samples_whole_episodes_from_it():
    register_env("keeps_agents", lambda cfg: KeepsAgentsEnv())
    cfg = config("keeps_agents", batch_mode="complete_episodes", rollout_fragment_length=10)
    with EnvRunner(cfg) as runner:
        runner.sample(num_episodes=4)
        metrics = runner.get_metrics()
    assert metrics["episodes"] >= 4 and metrics["num_faulty_episodes"] == 0
    assert metrics["episode_len_mean"] == EPISODE_LEN
    assert metrics["episode_reward_mean"] == pytest.approx(EPISODE_LEN + 3)  # a0 5, a1 3
