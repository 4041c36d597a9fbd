"""External envs for tests and benchmarks: client threads that play scripted episodes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs.external_env import ExternalMultiAgentEnv

# The five calls of an ExternalMultiAgentEnv, or of a PolicyClient: what a player drives.
Calls = Any


@dataclass
class PlayedEpisode:
    """What one client thread did in one episode, for comparing with the runner's batches."""

    rewards: dict[str, float] = field(default_factory=dict)
    logged_actions: list[tuple[str, int]] = field(default_factory=list)
    requests: int = 0  # get_action calls


class ThreadedExternalEnv(ExternalMultiAgentEnv):
    """`num_threads` client threads, each playing `episodes_per_thread` episodes.

    Agents `a0..a{num_agents-1}` with Box(-1, 1, (obs_dim,)) obs and Discrete(4)
    actions. In each episode of `episode_len` steps: agent `a0` acts every step;
    with `late_join`, agent `a2` first shows up at step 2; with `leave`,
    agent `a1` stops observing after step 2 (it gets rewards on and a fake final
    obs at the end); every `off_policy_every`-th step (0: never) is a
    `log_action` with action 3 for every agent instead of a `get_action`. A
    reward is logged after every step for every agent that joined, plus one
    before the first step for `a0`. `played` lists every finished episode.
    """

    def __init__(
        self,
        num_threads: int = 4,
        episodes_per_thread: int = 3,
        episode_len: int = 6,
        num_agents: int = 2,
        obs_dim: int = 3,
        late_join: bool = False,
        leave: bool = False,
        off_policy_every: int = 0,
        seed: int = 0,
    ) -> None:
        agents = [f"a{i}" for i in range(num_agents)]
        obs_space = gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        super().__init__(
            dict.fromkeys(agents, obs_space), dict.fromkeys(agents, gym.spaces.Discrete(4))
        )
        self.num_threads = num_threads
        self.episodes_per_thread = episodes_per_thread
        self.episode_len = episode_len
        self.late_join = late_join
        self.leave = leave
        self.off_policy_every = off_policy_every
        self.seed = seed
        self.played: list[PlayedEpisode] = []
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._play_thread, args=(i,), daemon=True)
            for i in range(self.num_threads)
        ]
        for thread in threads:
            thread.start()
        # Listed only once all have started: an unstarted thread is not alive either, so
        # `done()` would otherwise be true while the first finished and the rest had not begun.
        self.threads = threads

    def done(self) -> bool:
        """All client threads started and finished."""
        return bool(self.threads) and not any(t.is_alive() for t in self.threads)

    def _play_thread(self, index: int) -> None:
        rng = np.random.default_rng(self.seed * 1000 + index)
        try:
            for _ in range(self.episodes_per_thread):
                episode = play_scripted_episode(self, self, rng)
                with self._lock:
                    self.played.append(episode)
        except BaseException as exc:
            with self._lock:
                self.errors.append(exc)


def play_scripted_episode(
    calls: Calls, env: ThreadedExternalEnv, rng: np.random.Generator
) -> PlayedEpisode:
    """One episode as `ThreadedExternalEnv` describes it, through `calls`."""
    agents = env.possible_agents
    record = PlayedEpisode()
    episode_id = calls.start_episode()
    first = round(float(rng.uniform(-1, 1)), 3)
    calls.log_returns(episode_id, {agents[0]: first})
    record.rewards[agents[0]] = first
    joined: set[str] = set()
    for t in range(env.episode_len):
        active = [
            a for i, a in enumerate(agents)
            if not (env.late_join and i == 2 and t < 2) and not (env.leave and i == 1 and t > 2)
        ]
        joined.update(active)
        obs = {a: rng.uniform(-1, 1, env.observation_spaces[a].shape).astype(np.float32) for a in active}
        if env.off_policy_every and t % env.off_policy_every == env.off_policy_every - 1:
            calls.log_action(episode_id, obs, dict.fromkeys(active, 3))
            record.logged_actions.extend((a, 3) for a in active)
        else:
            actions = calls.get_action(episode_id, obs)
            record.requests += 1
            if set(actions) != set(active):
                raise AssertionError(f"get_action answered agents {list(actions)}, asked {active}")
            for action in actions.values():
                if not env.action_spaces[agents[0]].contains(np.int64(action)):
                    raise AssertionError(f"action {action!r} is not in the action space")
        rewards = {a: round(float(rng.uniform(-1, 1)), 3) for a in sorted(joined)}
        calls.log_returns(episode_id, rewards)
        for agent, reward in rewards.items():
            record.rewards[agent] = record.rewards.get(agent, 0.0) + reward
    final = {a: np.zeros(env.observation_spaces[a].shape, np.float32) for a in agents[:1]}
    calls.end_episode(episode_id, final)
    return record
