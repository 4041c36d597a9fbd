"""``env.capture_state``: PettingZoo's global state on every row as ``env_state``, on every
vectorize mode, never in the infos or the observation; envs without ``state()`` refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import ParallelEnv

from connectors import (
    ENV_STATE_INFO_KEY,
    AgentConnectorPipeline,
    AgentRows,
    ConnectorContext,
    ConnectorError,
    EnvStateAgentConnector,
)
from marl_runner import EnvRunner, RunnerConfig, check_batch_invariants, concat_samples
from marl_runner.config import ConfigError
from marl_runner.envs import EnvError, make_env

SPREAD = "mpe2.simple_spread_v3:parallel_env"
SPREAD_AEC = "mpe2.simple_spread_v3:env"
TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"
REPO = Path(__file__).resolve().parents[1]


def spread_config(**overrides: Any) -> RunnerConfig:
    data = {
        "env": {"name": SPREAD, "config": {"N": 3, "max_cycles": 25}, "capture_state": True},
        "num_envs": 2,
        "rollout_fragment_length": 30,
        "seed": 3,
        "policies": {"shared": {"model": {"type": "mlp", "hidden": [16]}}},
    }
    data.update(overrides)
    return RunnerConfig.from_dict(data)


def check_spread_states(batch: Any) -> None:
    """simple_spread's state() is its agents' observations end to end (mpe2's definition), so
    each env step's ``env_state`` must equal the three obs of that step, for every agent."""
    rows = batch.policy_batches["shared"]
    assert rows["obs"].shape[1:] == (18,)  # the policy's input is the agent's own obs only
    assert rows["env_state"].shape == (len(rows), 54)
    assert all(ENV_STATE_INFO_KEY not in info for info in rows["infos"])
    for column, obs_column in (("env_state", "obs"), ("new_env_state", "new_obs")):
        steps: dict[tuple[int, int, int], dict[int, int]] = {}
        for i, key in enumerate(zip(rows["env_id"], rows["eps_id"], rows["t"])):
            steps.setdefault(tuple(int(k) for k in key), {})[int(rows["agent_index"][i])] = i
        full_steps = [agents for agents in steps.values() if len(agents) == 3]
        assert len(full_steps) >= 10
        for agents in full_steps:
            expected = np.concatenate([rows[obs_column][agents[a]] for a in range(3)])
            for i in agents.values():  # all agents of one env step share its state
                np.testing.assert_array_equal(rows[column][i], expected)


@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_env_state_is_the_envs_state_at_each_step(vectorize: str) -> None:
    with EnvRunner(spread_config(vectorize=vectorize)) as runner:
        assert runner.policy_map["shared"].observation_space.shape == (18,)
        batch = concat_samples([runner.sample(), runner.sample()])  # spans episode ends
    check_batch_invariants(batch)
    check_spread_states(batch)


@pytest.mark.slow
def test_env_state_on_ray_sub_envs(ray_local: Any) -> None:
    with EnvRunner(spread_config(vectorize="ray")) as runner:
        batch = concat_samples([runner.sample(), runner.sample()])
    check_spread_states(batch)


def test_aec_envs_hand_out_their_state_too() -> None:
    env = make_env({"name": SPREAD_AEC, "config": {"N": 2, "max_cycles": 5}, "capture_state": True})
    obs, infos = env.reset(seed=0)
    (agent,) = obs
    np.testing.assert_array_equal(infos[agent][ENV_STATE_INFO_KEY], env.env.state())
    obs, _, _, _, infos = env.step({agent: 0})
    (agent,) = obs
    np.testing.assert_array_equal(infos[agent][ENV_STATE_INFO_KEY], env.env.state())


def test_without_capture_state_nothing_changes() -> None:
    config = spread_config(env={"name": SPREAD, "config": {"N": 3, "max_cycles": 25}})
    assert "capture_state" not in config.env
    with EnvRunner(config) as runner:
        rows = runner.sample().policy_batches["shared"]
    assert "env_state" not in rows and "new_env_state" not in rows


# ------------------------------------------------------------ refused: no state to capture


def test_an_env_without_state_is_refused_when_the_runner_is_built() -> None:
    config = spread_config(
        env={"name": TICTACTOE, "capture_state": True}, policies={"p": {}}, num_envs=1
    )
    with pytest.raises(EnvError, match=r"env.capture_state.*raw_env.*does not implement state"):
        EnvRunner(config)


def test_validate_names_the_key_and_the_env(tmp_path: Path) -> None:
    path = tmp_path / "ttt.yaml"
    path.write_text(
        f"env: {{name: '{TICTACTOE}', capture_state: true}}\npolicies: {{p: {{}}}}\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "marl_runner.cli", "validate", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "env.capture_state" in done.stderr and "tictactoe" in done.stderr
    assert "does not implement state()" in done.stderr


class _StatelessParallel(ParallelEnv):
    """A ParallelEnv whose state() returns None: caught at the first reset."""

    metadata = {"name": "stateless"}
    possible_agents = ["a"]

    def __init__(self) -> None:
        self.agents = []

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-1, 1, (1,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: Any = None, options: Any = None) -> tuple[dict, dict]:
        self.agents = ["a"]
        return {"a": np.zeros(1, np.float32)}, {"a": {}}

    def state(self) -> Any:
        return None


def test_a_state_of_none_is_refused_naming_the_key() -> None:
    env = make_env({"name": f"{__name__}:_StatelessParallel", "capture_state": True})
    with pytest.raises(EnvError, match=r"env.capture_state.*returns None from state\(\)"):
        env.reset(seed=0)


def test_capture_state_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"env.capture_state.*expected true or false"):
        spread_config(env={"name": SPREAD, "capture_state": "yes"})
    assert spread_config().to_dict()["env"]["capture_state"] is True
    assert RunnerConfig.from_dict(spread_config().to_dict()) == spread_config()


# ------------------------------------------------------------ fake final obs rows


class _SkippingParallel(ParallelEnv):
    """Agent ``b`` observes on even steps only; the episode ends at step 3, so ``b`` ends
    without a final obs (the runner gives it a fake one). state() is ``[t, 100 + t]``."""

    metadata = {"name": "skipping"}
    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-100, 100, (1,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def state(self) -> np.ndarray:
        return np.array([self.t, 100 + self.t], np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        seen = ["a", "b"] if self.t % 2 == 0 else ["a"]
        return {agent: np.full(1, self.t, np.float32) for agent in seen}

    def reset(self, seed: Any = None, options: Any = None) -> tuple[dict, dict]:
        self.agents, self.t = ["a", "b"], 0
        return self._obs(), {agent: {"t": 0} for agent in self._obs()}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        obs = self._obs()
        over = self.t == 3
        flags = {agent: over for agent in self.agents}
        if over:
            self.agents = []
        return obs, {a: 1.0 for a in flags}, dict(flags), dict(flags), {a: {"t": self.t} for a in obs}


def test_a_fake_final_obs_row_gets_the_episodes_last_state() -> None:
    config = RunnerConfig.from_dict(
        {
            "env": {"name": f"{__name__}:_SkippingParallel", "capture_state": True},
            "batch_mode": "complete_episodes",
            "policies": {"p": {"model": {"type": "mlp", "hidden": [4]}}},
        }
    )
    with EnvRunner(config) as runner:
        rows = runner.sample(num_episodes=2).policy_batches["p"]
    np.testing.assert_array_equal(rows["env_state"][:, 0], rows["obs"][:, 0])  # obs is t
    b_final = (rows["agent_index"] == 1) & rows["truncateds"]
    assert b_final.sum() == 2  # one per episode, each closed by a fake final obs
    np.testing.assert_array_equal(rows["new_env_state"][b_final], [[3, 103], [3, 103]])
    real = ~b_final
    np.testing.assert_array_equal(rows["new_env_state"][real, 0], rows["new_obs"][real, 0])


def test_a_row_without_any_state_is_an_error_naming_the_agent() -> None:
    """Listing the connector without capture_state (or an env that never adds the state)."""
    ctx = ConnectorContext(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2))
    pipeline = AgentConnectorPipeline(ctx, [EnvStateAgentConnector(ctx)])
    rows = _rows(infos=[{}], env_ids=[4], agent_ids=["archer_0"])
    with pytest.raises(ConnectorError, match=r"'archer_0' in sub-env 4.*env.capture_state: true"):
        pipeline(rows)


def test_states_move_out_of_the_infos_into_one_column() -> None:
    ctx = ConnectorContext(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2))
    connector = EnvStateAgentConnector(ctx)
    state = np.arange(3, dtype=np.float32)
    infos = [{ENV_STATE_INFO_KEY: state, "x": 1}, {ENV_STATE_INFO_KEY: state}]
    rows = connector(_rows(infos=infos, env_ids=[0, 0], agent_ids=["a", "b"]))
    np.testing.assert_array_equal(rows["env_state"], [state, state])
    assert rows["infos"] == [{"x": 1}, {}]


def _rows(infos: list[dict], env_ids: list[int], agent_ids: list[str]) -> Any:
    n = len(infos)
    return AgentRows(
        {
            "obs": np.zeros((n, 1), np.float32),
            "infos": infos,
            "env_ids": np.array(env_ids),
            "agent_ids": np.array(agent_ids, object),
            "keys": np.arange(n),
            "is_first": np.zeros(n, bool),
        }
    )
