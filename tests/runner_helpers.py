"""Shared helpers for runner tests: configs, reward logs, and episode bookkeeping."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from marl_runner import Callbacks, MultiAgentBatch, RunnerConfig
from marl_runner.checks import rewards_per_trajectory, trajectory_rows
from marl_runner.envs import MultiAgentEnv, make_env, register_env


class RewardLogging(MultiAgentEnv):
    """Wraps any MultiAgentEnv and records per episode the rewards it handed out."""

    def __init__(self, env: MultiAgentEnv) -> None:
        self.env = env
        self.possible_agents = env.possible_agents
        self.observation_spaces = env.observation_spaces
        self.action_spaces = env.action_spaces
        self.reward_log: list[dict[Any, float]] = []

    def get_observation_space(self, agent: Any) -> Any:
        return self.env.get_observation_space(agent)

    def get_action_space(self, agent: Any) -> Any:
        return self.env.get_action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.reward_log.append(defaultdict(float))
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict) -> tuple:
        result = self.env.step(actions)
        for agent, reward in result[1].items():
            self.reward_log[-1][agent] += float(reward)
        return result

    def close(self) -> None:
        self.env.close()


def logged_env_name(name: str) -> str:
    """Registers (once) a reward-logging version of the env at import path ``name``."""
    logged = "logged_" + name.replace(":", "__").replace(".", "_")
    register_env(logged, lambda cfg, name=name: RewardLogging(make_env({"name": name, "config": cfg})))
    return logged


class EpisodeTracker(Callbacks):
    """Remembers, per sub-env, the episodes in start order and their agents' indices."""

    def __init__(self) -> None:
        self.started: dict[int, list[int]] = defaultdict(list)
        self.agents: dict[int, dict[int, Any]] = {}
        self.ended: list[int] = []
        self.events: list[tuple[str, int]] = []

    def on_episode_created(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
        self.events.append(("created", env_index))

    def on_episode_start(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
        self.started[env_index].append(episode.episode_id)
        self.events.append(("start", env_index))

    def on_episode_step(self, *, env_index: int, **kwargs: Any) -> None:
        self.events.append(("step", env_index))

    def on_episode_end(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
        if not episode.faulty:
            self.ended.append(episode.episode_id)
            self.agents[episode.episode_id] = {
                episode.agent_index(a): a for a in episode.get_agents()
            }
        self.events.append(("end", env_index))


def config(env_name: str, policies: dict | None = None, **overrides: Any) -> RunnerConfig:
    """A small runner config for tests: one random-free MLP policy unless told otherwise."""
    env_config = overrides.pop("env_config", {})
    data = {
        "env": {"name": env_name, "config": env_config},
        "num_envs": 2,
        "rollout_fragment_length": 20,
        "policies": policies or {"shared": {"model": {"type": "mlp", "hidden": [16]}}},
        **overrides,
    }
    return RunnerConfig.from_dict(data)


def assert_rewards_conserved(
    batch: MultiAgentBatch, runner: Any, tracker: EpisodeTracker, *, min_episodes: int = 1
) -> int:
    """Per (episode, agent): the batch's reward sum equals what the env handed out.

    Checks the finished episodes whose every trajectory is complete in the
    batch (all of them in ``complete_episodes`` mode); returns how many.
    """
    totals = rewards_per_trajectory(batch)
    complete = _complete_trajectories(batch)
    checked = 0
    for env_index, episode_ids in tracker.started.items():
        log = runner.env.get_sub_environments()[env_index].reward_log
        # A restarted sub-env is a new env with a new log: it covers the latest episodes.
        first_logged = len(episode_ids) - len(log)
        for position, eps_id in enumerate(episode_ids):
            if eps_id not in tracker.agents or position < first_logged:
                continue
            agents = tracker.agents[eps_id]
            if not all((eps_id, index) in complete for index in agents):
                continue
            given = log[position - first_logged]
            for index, agent in agents.items():
                got = totals.get((eps_id, index), 0.0)
                assert np.isclose(got, given.get(agent, 0.0), atol=1e-4), (
                    f"env {env_index} episode {position} agent {agent!r}: batch rewards "
                    f"sum to {got}, env gave {given.get(agent, 0.0)}"
                )
            checked += 1
    assert checked >= min_episodes, f"only {checked} complete episodes to check"
    return checked


def _complete_trajectories(batch: MultiAgentBatch) -> set[tuple[int, int]]:
    complete = set()
    for policy_batch in batch.policy_batches.values():
        done = policy_batch["terminateds"] | policy_batch["truncateds"]
        for key, rows in trajectory_rows(policy_batch).items():
            if done[rows[-1]] and policy_batch["t"][rows[0]] == 0:
                complete.add(key)
    return complete


class FailsOnceAtThirdEpisodeEnd(Callbacks):
    """``on_episode_end`` raises at the third episode end of the one runner that first
    creates ``token`` (a file): one failed sample in the whole group, restarts included."""

    def __init__(self, token: str) -> None:
        self.token, self.ended = token, 0

    def on_episode_end(self, **kwargs: Any) -> None:
        self.ended += 1
        if self.ended == 3:
            try:
                with open(self.token, "x"):
                    pass
            except FileExistsError:
                return
            raise RuntimeError("on_episode_end broke")


class FailsPostprocessingWhenTold(Callbacks):
    """``on_postprocess_trajectory`` raises while ``failing`` is set (a test sets it on
    one runner of a group)."""

    failing = False

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        if self.failing:
            raise RuntimeError("postprocessing broke")
