"""Envs and checks the Ray tests share (Ray workers import them from here), and
tests of them on the sync vector env, so that the Ray tests stand on checked ground.

- `TimedEnv` reports, in each agent's info of the step that ends it, the sum
  of the rewards it handed that agent: a batch from any process can then be
  checked for conserved rewards without access to the env object.
- `ObsRecorder` is an agent connector that keeps every observation it passes,
  to compare filter statistics with those of the pooled raw observations.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np

from connectors import AgentConnector
from marl_runner import EnvRunner, MultiAgentBatch, RunnerConfig, check_batch_invariants
from marl_runner.checks import trajectory_rows
from marl_runner.envs import MultiAgentEnv

TIMED_ENV = "tests.test_ray_envs:TimedEnv"


class TimedEnv(MultiAgentEnv):
    """`num_agents` agents, all acting every round, for `episode_len` rounds.

    Obs (Box(4)) and rewards are drawn from the env's RNG; obs also carry the
    agents' last actions, so a runner that mixes up actions changes the data.
    Each step sleeps `step_delay_s`, or `slow_delay_s` when the env's first
    reset had the seed `slow_seed` (that is how one sub-env of a vector env
    is made slow: sub-env i is first seeded `seed + i`).
    """

    def __init__(
        self,
        num_agents: int = 2,
        episode_len: int = 10,
        step_delay_s: float = 0.0,
        slow_seed: int | None = None,
        slow_delay_s: float = 0.0,
    ) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        space = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(3))
        self.episode_len = episode_len
        self.delay_s = step_delay_s
        self.slow_seed = slow_seed
        self.slow_delay_s = slow_delay_s
        self._rng = np.random.default_rng()
        self._seeded = False
        self._t = 0
        self._totals: dict[str, float] = {}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            if not self._seeded and seed == self.slow_seed:
                self.delay_s = self.slow_delay_s
            self._seeded = True
        self._t = 0
        self._totals = dict.fromkeys(self.possible_agents, 0.0)
        return {agent: self._obs(0) for agent in self.possible_agents}, {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        if self.delay_s:
            time.sleep(self.delay_s)
        self._t += 1
        done = self._t >= self.episode_len
        obs, rewards, infos = {}, {}, {}
        for agent in self.possible_agents:
            reward = float(self._rng.integers(-3, 4))
            self._totals[agent] += reward
            rewards[agent] = reward
            obs[agent] = self._obs(actions.get(agent, 0))
            infos[agent] = {"reward_total": self._totals[agent]} if done else {}
        truncateds = {**dict.fromkeys(self.possible_agents, done), "__all__": done}
        terminateds = dict.fromkeys(truncateds, False)
        return obs, rewards, terminateds, truncateds, infos

    def _obs(self, action: int) -> np.ndarray:
        obs = self._rng.normal(0.0, 3.0, 4).astype(np.float32)
        obs[0] = action
        return obs


class ObsRecorder(AgentConnector):
    """Passes rows on unchanged, keeping a copy of every training observation."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.seen: list[np.ndarray] = []

    def __call__(self, rows: Any) -> Any:
        obs = np.asarray(rows["obs"], dtype=np.float32)
        if self.is_training and len(obs):
            self.seen.append(obs.copy())
        return rows


def recorded_obs(runner: Any) -> dict[str, np.ndarray]:
    """`policy_id -> every obs its ObsRecorder saw` (for `foreach_runner`)."""
    return {
        policy_id: np.concatenate(connector.seen)
        for policy_id, policy in runner.policy_map.items()
        for connector in policy.agent_connectors
        if type(connector).__name__ == "ObsRecorder" and connector.seen  # any copy of this module
    }


def timed_config(**overrides: Any) -> RunnerConfig:
    env_config = overrides.pop("env_config", {})
    return RunnerConfig.from_dict(
        {
            "env": {"name": TIMED_ENV, "config": env_config},
            "num_envs": 2,
            "rollout_fragment_length": 10,
            "batch_mode": "complete_episodes",
            "policies": {"shared": {"model": {"type": "mlp", "hidden": [8]}}},
            **overrides,
        }
    )


def check_complete_episodes(batch: MultiAgentBatch, episode_len: int) -> set[int]:
    """Every trajectory in `batch` is a whole TimedEnv episode whose rewards sum to
    what the env handed out; returns the episode ids."""
    check_batch_invariants(batch)
    eps_ids = set()
    for policy_batch in batch.policy_batches.values():
        for (eps_id, _agent), rows in trajectory_rows(policy_batch).items():
            eps_ids.add(int(eps_id))
            assert len(rows) == episode_len, f"episode {eps_id}: {len(rows)} rows, not {episode_len}"
            assert policy_batch["t"][rows[0]] == 0
            assert policy_batch["truncateds"][rows[-1]]
            given = policy_batch["infos"][rows[-1]]["reward_total"]
            got = float(np.sum(policy_batch["rewards"][rows]))
            assert np.isclose(got, given), f"episode {eps_id}: rewards sum to {got}, env gave {given}"
    return eps_ids


def episodes_per_env(batch: MultiAgentBatch) -> dict[int, list[dict[int, tuple]]]:
    """`env_id -> its episodes in order`, each `agent_index -> (actions, rewards)`."""
    per_env: dict[int, dict[int, dict[int, tuple]]] = defaultdict(dict)
    for policy_batch in batch.policy_batches.values():
        for (eps_id, agent_index), rows in trajectory_rows(policy_batch).items():
            env_id = int(policy_batch["env_id"][rows[0]])
            episode = per_env[env_id].setdefault(int(eps_id), {})
            episode[int(agent_index)] = (
                policy_batch["actions"][rows].tolist(),
                policy_batch["rewards"][rows].tolist(),
            )
    return {env_id: list(episodes.values()) for env_id, episodes in per_env.items()}


# ---- the helpers themselves, on the sync vector env


def test_timed_env_reports_conserved_rewards_on_sync() -> None:
    with EnvRunner(timed_config(env_config={"episode_len": 7})) as runner:
        batch = runner.sample(num_episodes=4)
    assert len(check_complete_episodes(batch, episode_len=7)) >= 4


def test_timed_env_slow_seed_slows_only_that_env() -> None:
    fast = TimedEnv(slow_seed=5, slow_delay_s=0.05)
    fast.reset(seed=4)
    assert fast.delay_s == 0.0
    slow = TimedEnv(slow_seed=5, slow_delay_s=0.05)
    slow.reset(seed=5)
    start = time.perf_counter()
    slow.step({})
    assert time.perf_counter() - start >= 0.05


def test_obs_recorder_sees_every_obs_on_sync() -> None:
    cfg = timed_config(
        policies={
            "shared": {
                "model": {"type": "mlp", "hidden": [8]},
                "agent_connectors": ["tests.test_ray_envs:ObsRecorder"],
            }
        }
    )
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=2)
        seen = recorded_obs(runner)["shared"]
    # every row's obs went through it (plus the final obs of each ended episode)
    stored = batch.policy_batches["shared"]["obs"]
    assert len(seen) >= len(stored)
    assert {row.tobytes() for row in stored} <= {row.tobytes() for row in seen}
