"""Policy mapping, the policy map between samples, spaces, weights and metrics."""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

from marl_runner import ConfigError, EnvRunner, RandomPolicy, RunnerConfig, check_batch_invariants
from marl_runner.envs import MultiAgentEnv
from marl_runner.mapping import SpaceMismatchError
from tests.runner_helpers import config

CHEAP = "marl_runner.bench.envs:CheapEnv"
CHEAP_CONFIG = {"num_agents": 4, "episode_len": 10}
TWO = {"even": {"model": {"type": "mlp", "hidden": [8]}}, "odd": {"model": {"type": "mlp", "hidden": [8]}}}


def by_parity(agent_id: str, episode, **kwargs) -> str:
    return "even" if int(agent_id.rsplit("_", 1)[1]) % 2 == 0 else "odd"


def _cheap(**overrides) -> RunnerConfig:
    overrides.setdefault("env_config", CHEAP_CONFIG)
    return config(CHEAP, **overrides)


@pytest.mark.parametrize(
    "mapping",
    [
        "tests.test_runner_policies:by_parity",
        {"agent_0": "even", "agent_2": "even", "agent_*": "odd"},
    ],
)
def test_mapping_from_import_path_or_glob_dict(mapping) -> None:
    with EnvRunner(_cheap(policies=TWO, policy_mapping_fn=mapping)) as runner:
        batch = runner.sample()
    assert set(batch.policy_batches) == {"even", "odd"}
    assert set(np.unique(batch.policy_batches["even"]["agent_index"])) == {0, 2}


def test_callable_mapping_is_called_once_per_agent_and_episode() -> None:
    calls = Counter()

    def mapping(agent_id, episode, **kwargs):
        calls[(episode.episode_id, agent_id)] += 1
        return by_parity(agent_id, episode)

    with EnvRunner(_cheap(policies=TWO), policy_mapping_fn=mapping) as runner:
        runner.sample(num_env_steps=60)
    assert calls and set(calls.values()) == {1}


def test_policy_for_refresh_calls_the_mapping_again() -> None:
    seen = []

    def mapping(agent_id, episode, **kwargs):
        seen.append(agent_id)
        return "even"

    with EnvRunner(_cheap(policies=TWO), policy_mapping_fn=mapping) as runner:
        runner.step()
        episode = next(iter(runner._episodes.active.values()))
        before = len(seen)
        assert episode.policy_for("agent_1") == "even" and len(seen) == before
        assert episode.policy_for("agent_1", refresh=True) == "even" and len(seen) == before + 1


def test_a_mapping_to_an_unknown_policy_names_both_ids() -> None:
    with pytest.raises(ValueError, match=r"returned 'nope' for agent 'agent_0'.*'even', 'odd'"):
        EnvRunner(_cheap(policies=TWO), policy_mapping_fn=lambda a, e, **k: "nope")


def test_a_glob_dict_naming_an_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nope"):
        _cheap(policies=TWO, policy_mapping_fn={"agent_*": "nope"})


class TwoSizesEnv(MultiAgentEnv):
    """Two agents whose observations differ in size."""

    def __init__(self) -> None:
        self.possible_agents = ["small", "big"]
        self.observation_spaces = {
            "small": gym.spaces.Box(-1, 1, (2,), np.float32),
            "big": gym.spaces.Box(-1, 1, (5,), np.float32),
        }
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}

    def reset(self, seed=None, options=None):
        return {a: s.sample() for a, s in self.observation_spaces.items()}, {}

    def step(self, actions):
        obs = {a: s.sample() for a, s in self.observation_spaces.items()}
        flags = {a: False for a in obs} | {"__all__": False}
        return obs, dict.fromkeys(obs, 0.0), flags, dict(flags), {}


def test_agents_with_different_spaces_on_one_policy_is_a_clear_error() -> None:
    with pytest.raises(SpaceMismatchError, match=r"'small' and 'big' both map to policy 'shared'"):
        EnvRunner(config("tests.test_runner_policies:TwoSizesEnv"))


def test_remove_policy_moves_running_agents_to_their_new_policy() -> None:
    runner = EnvRunner(_cheap(policies=TWO, rollout_fragment_length=5),
                       policy_mapping_fn=by_parity)
    with runner:
        runner.sample()
        runner.set_policy_mapping_fn(lambda agent_id, episode, **kw: "even")
        runner.remove_policy("odd")
        batch = runner.sample()
    assert set(runner.policy_map) == {"even"}
    check_batch_invariants(batch, t_from_zero=False)
    assert set(np.unique(batch.policy_batches["even"]["agent_index"])) == {0, 1, 2, 3}


def test_remove_policy_that_would_split_a_group_raises() -> None:
    three = {**TWO, "third": {"model": {"type": "mlp", "hidden": [8]}}}

    def first_mapping(agent_id, episode, **kwargs):
        return "third" if agent_id in ("agent_0", "agent_1") else by_parity(agent_id, episode)

    with EnvRunner(_cheap(policies=three), policy_mapping_fn=first_mapping) as runner:
        runner.step()
        runner.set_policy_mapping_fn(by_parity)
        with pytest.raises(ValueError, match=r"removing policy 'third'.*\['even', 'odd'\]"):
            runner.remove_policy("third")


def test_add_policy_between_samples() -> None:
    with EnvRunner(_cheap(policies={"even": {}, "odd": {}}), policy_mapping_fn=by_parity) as runner:
        runner.sample()
        runner.add_policy("random", {"policy_class": "RandomPolicy"},
                          policy_mapping_fn=lambda agent_id, episode, **kw: "random")
        assert isinstance(runner.policy_map["random"], RandomPolicy)
        runner.sample(num_env_steps=40)  # episodes of 10 steps: new ones use "random"
        batch = runner.sample()
    assert "random" in batch.policy_batches


def test_ready_made_policies_win_over_the_config() -> None:
    obs_space = gym.spaces.Box(-np.inf, np.inf, (16,), np.float32)
    ready = RandomPolicy(obs_space, gym.spaces.Discrete(5), {"seed": 1})
    with EnvRunner(_cheap(), policies={"shared": ready}) as runner:
        assert runner.policy_map["shared"] is ready
        batch = runner.sample()
    assert len(batch.policy_batches["shared"]) == 2 * 20 * 4


def test_spaces_weights_and_state_round_trip() -> None:
    with EnvRunner(_cheap(policies=TWO, policy_mapping_fn="tests.test_runner_policies:by_parity")) as first, \
         EnvRunner(_cheap(policies=TWO, policy_mapping_fn="tests.test_runner_policies:by_parity", seed=3)) as second:
        assert first.get_spaces()["even"][0].shape == (16,)
        assert first.get_spaces()["even"][1] == gym.spaces.Discrete(5)
        second.set_state(first.get_state())
        for policy_id, weights in first.get_weights().items():
            for name, value in weights.items():
                np.testing.assert_array_equal(value, second.get_weights()[policy_id][name])


@pytest.mark.parametrize("ema_coef", [None, 0.1])
def test_metrics_report_phases_and_throughput(ema_coef) -> None:
    with EnvRunner(_cheap(ema_coef=ema_coef)) as runner:
        runner.sample(num_env_steps=120)
        metrics = runner.get_metrics()
    assert metrics["episodes"] == 12 and metrics["episode_len_mean"] == 10
    assert metrics["num_env_steps"] >= 120 and metrics["num_agent_steps"] == 4 * metrics["num_env_steps"]
    assert metrics["env_steps_per_s"] > 0 and metrics["agent_steps_per_s"] > 0
    assert set(metrics["policy_reward_mean"]) == {"shared"}
    assert set(metrics["perf"]) == {
        "mean_raw_obs_processing_ms", "mean_inference_ms", "mean_action_processing_ms",
        "mean_env_wait_ms", "mean_env_render_ms",
    }
    assert metrics["perf"]["mean_inference_ms"] > 0
    assert runner.get_metrics()["episodes"] == 0  # counts restart after each call


def test_bad_config_values_raise_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="rollout_fragment_length"):
        EnvRunner({"env": {"name": CHEAP}, "policies": {"p": {}}, "rollout_fragment_length": 0})
    with pytest.raises(ConfigError, match="batch_mod"):
        EnvRunner({"env": {"name": CHEAP}, "policies": {"p": {}}, "batch_mod": "x"})


def test_every_row_records_the_policy_version_that_chose_its_action() -> None:
    with EnvRunner(_cheap(rollout_fragment_length=5)) as runner:
        first = runner.sample().policy_batches["shared"]
        assert runner.policy_versions() == {"shared": 0}
        runner.set_weights(runner.get_weights())
        runner.set_weights(runner.get_weights())
        assert runner.policy_versions() == {"shared": 2}
        second = runner.sample().policy_batches["shared"]
    assert first["policy_version"].dtype == np.int64 and (first["policy_version"] == 0).all()
    # A transition opened before the new weights arrived was chosen by the old ones.
    opened_before = second["t"] == np.array(
        [first["t"][(first["eps_id"] == e) & (first["agent_index"] == a)].max(initial=-2) + 1
         for e, a in zip(second["eps_id"], second["agent_index"])]
    )
    assert opened_before.any() and (~opened_before).any()
    np.testing.assert_array_equal(second["policy_version"], np.where(opened_before, 0, 2))


def test_set_weights_bumps_the_version_once_per_call_and_not_when_it_fails() -> None:
    class Nested(RandomPolicy):
        def set_weights(self, weights):
            super().set_weights(weights)

    policy = Nested(gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(2))
    policy.set_weights({})
    assert policy.policy_version == 1
    with pytest.raises(ValueError, match="no weights"):
        policy.set_weights({"w": np.zeros(1)})
    assert policy.policy_version == 1
