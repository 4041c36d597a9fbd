"""A trajectory key freed mid-episode (an agent's final transition handed out) may go to an
agent that spawns later in the same episode: the two agents must never be mixed up."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from marl_runner import EnvRunner
from marl_runner.callbacks import Callbacks
from marl_runner.envs import MultiAgentEnv
from marl_runner.envs.registry import register_env
from tests.runner_helpers import config

CRASH_ROUND = 7


class DieThenSpawnEnv(MultiAgentEnv):
    """a0 and a1 from the start; a0 terminates at round 2; b0 spawns at round 4; truncated
    at round 8. Every agent given an action gets 1.0, so each agent's total is its number of
    actions. With ``crash``, its first episode's step raises at ``CRASH_ROUND`` (so does that
    of the env built again to restart the sub-env)."""

    def __init__(self, crash: bool = False) -> None:
        self.crash = crash
        self.possible_agents = ["a0", "a1", "b0"]
        space = gym.spaces.Box(-10, 10, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.episodes: list[dict[str, float]] = []  # what each episode gave, per agent

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t, self.live = 0, ["a0", "a1"]
        self.episodes.append({})
        return {agent: np.zeros(2, np.float32) for agent in self.live}, {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        if self.crash and len(self.episodes) == 1 and self.t == CRASH_ROUND:
            raise RuntimeError("crash")
        rewards = dict.fromkeys(actions, 1.0)
        for agent in actions:
            self.episodes[-1][agent] = self.episodes[-1].get(agent, 0.0) + 1.0
        obs = {agent: np.full(2, self.t, np.float32) for agent in self.live}
        terminateds: dict[str, bool] = {"__all__": False}
        if self.t == 2:
            terminateds["a0"] = True
            self.live.remove("a0")
        if self.t == 4:
            obs["b0"] = np.full(2, self.t, np.float32)
            self.live.append("b0")
        over = self.t == 8
        truncateds = {**dict.fromkeys(self.live if over else [], True), "__all__": over}
        return obs, rewards, terminateds, truncateds, {}


def _die_then_spawn(cfg: dict) -> DieThenSpawnEnv:
    return DieThenSpawnEnv(**cfg)


register_env("test_die_then_spawn", _die_then_spawn)


class EpisodeRewards(Callbacks):
    def __init__(self) -> None:
        self.ended: list[tuple[bool, dict[Any, float]]] = []

    def on_episode_end(self, **kwargs: Any) -> None:
        episode = kwargs["episode"]
        self.ended.append((episode.faulty, dict(episode.agent_rewards)))


def _runner(crash: bool, vectorize: str) -> tuple[EnvRunner, EpisodeRewards]:
    callbacks = EpisodeRewards()
    # Fragments of 3 rounds: a0's final transition goes out (its key freed) before b0 spawns.
    cfg = config(
        "test_die_then_spawn", num_envs=1, rollout_fragment_length=3, vectorize=vectorize,
        restart_failed_sub_environments=True, env_config={"crash": crash},
    )
    return EnvRunner(cfg, callbacks=callbacks), callbacks


@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_an_episode_dropped_after_a_key_was_reused_in_it_costs_that_episode_only(
    vectorize: str,
) -> None:
    runner, callbacks = _runner(True, vectorize)
    with runner:
        for _ in range(8):
            runner.sample()
        metrics = runner.get_metrics()
    faulty = [rewards for was_faulty, rewards in callbacks.ended if was_faulty]
    assert len(faulty) == metrics["num_faulty_episodes"] >= 2  # each a fault of its own
    for rewards in faulty:  # what the env gave before each crash, per agent
        assert rewards == {("a0", "shared"): 2.0, ("a1", "shared"): 6.0, ("b0", "shared"): 2.0}


def test_episode_rewards_keep_a_dead_agent_and_a_newcomer_on_its_key_apart() -> None:
    runner, callbacks = _runner(False, "sync")
    with runner:
        for _ in range(6):
            runner.sample()
        given = runner.env.get_sub_environments()[0].episodes
    finished = [rewards for _, rewards in callbacks.ended]
    assert len(finished) >= 2
    for rewards, env_totals in zip(finished, given):
        assert rewards == {(agent, "shared"): total for agent, total in env_totals.items()}
