"""Steps through the worker's slot block: every supported space gives sync's outputs,
and only what does not fit (or episode ends) is pickled."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest

from marl_runner.bench.envs.scripted_env import ScriptedEnv, every_round_script
from marl_runner.envs import SubprocessVectorEnv, SyncVectorEnv
from marl_runner.envs.shared_buffers import SlotBlock, layout_spec
from tests.envs import (
    CheapEnv,
    DyingAgentsEnv,
    SpawningAgentsEnv,
    assert_same,
    play_vector_env,
)
from tests.envs.space_envs import (
    BoxActionEnv,
    DictObsEnv,
    MaskInfoEnv,
    MultiDiscreteEnv,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

IMAGE = gym.spaces.Box(0, 255, (6, 5, 3), np.uint8)


class MixedSpacesEnv(ScriptedEnv):
    """Two agents with different spaces: "cam" sees a uint8 image and picks a Discrete
    action, "pos" sees a Discrete cell and picks a MultiDiscrete action."""

    def __init__(self, episode_len: int = 6) -> None:
        agents = ("cam", "pos")
        super().__init__(every_round_script(agents, episode_len), agents)
        self.observation_spaces = {"cam": IMAGE, "pos": gym.spaces.Discrete(9)}
        self.action_spaces = {"cam": gym.spaces.Discrete(4), "pos": gym.spaces.MultiDiscrete([3, 2])}

    def _observation(self, agent):
        if agent == "cam":
            return self._rng.integers(0, 256, IMAGE.shape, dtype=np.uint8)
        return int(self._rng.integers(9))


class Float64ObsEnv(CheapEnv):
    """Declares float32 obs but hands out float64 arrays: they do not fit the slot."""

    def step(self, actions):
        obs, *rest = super().step(actions)
        return ({agent: value.astype(np.float64) for agent, value in obs.items()}, *rest)


def build(env_class, index: int):
    """Sub-env `index` of a vector env of `env_class` (a picklable creator with partial)."""
    return env_class(episode_len=10) if env_class is CheapEnv else env_class()


def run_both(env_class, num_envs=4, num_workers=2, rounds=24):
    make_one = functools.partial(build, env_class)
    sync = SyncVectorEnv(make_one, num_envs, seed=5)
    with SubprocessVectorEnv(make_one, num_envs, seed=5, num_workers=num_workers) as sub:
        expected, got = play_vector_env(sync, rounds), play_vector_env(sub, rounds)
        stats = sub.stats
    sync.stop()
    assert_same(expected, got)
    return stats


@pytest.mark.parametrize(
    "env_class",
    [CheapEnv, MixedSpacesEnv, DictObsEnv, BoxActionEnv, MultiDiscreteEnv, DyingAgentsEnv,
     SpawningAgentsEnv],
    ids=lambda f: f.__name__,
)
def test_every_space_goes_through_the_block_with_syncs_outputs(env_class):
    stats = run_both(env_class)
    assert stats.env_steps > 0
    assert stats.pickled_env_steps == 0


@pytest.mark.parametrize("env_class", [MaskInfoEnv, Float64ObsEnv], ids=lambda f: f.__name__)
def test_what_does_not_fit_goes_pickled_with_syncs_outputs(env_class):
    stats = run_both(env_class)
    assert stats.pickled_env_steps == stats.env_steps > 0


def test_steps_without_episode_ends_pickle_nothing():
    with SubprocessVectorEnv(cheap_env, 6, seed=0, num_workers=2) as sub:
        play_vector_env(sub, 5)  # key sets are learned in the first steps
        sub.reset_stats()
        play_vector_env(sub, 10)
        assert sub.stats.env_steps == 6 * 10
        assert sub.stats.pickled_step_messages == 0
        assert sub.stats.pickled_env_steps == 0


def cheap_env(index: int) -> CheapEnv:
    return CheapEnv(num_agents=3, episode_len=50)


def test_slot_block_round_trip_in_one_process_keeps_order_and_refuses_misfits():
    env = MixedSpacesEnv()
    spec = layout_spec(env, num_envs=2)
    writer = SlotBlock.create(spec, None)
    reader = SlotBlock.attach(spec, writer.name)
    try:
        image = np.arange(IMAGE.shape[0] * 5 * 3, dtype=np.uint8).reshape(IMAGE.shape)
        result = [
            {"pos": 3, "cam": image},  # not in possible_agents order: order is kept
            {"cam": 1, "pos": 0.5},
            {"pos": False, "cam": True, "__all__": False},
            {"__all__": False},
            {"pos": {}, "cam": {}},
        ]
        new = []
        assert writer.write_result(1, result, new)
        for number, keys in new:
            reader.in_sets.learn(number, keys)
        got = reader.result(reader.read_results(), 1)
        assert_same(result, got)
        assert type(got[1]["cam"]) is float  # mixed int/float rewards come back as floats
        assert not writer.write_result(0, [{"cam": image.astype(np.int16)}, *result[1:]], new)
        assert not writer.write_result(0, [{"ghost": 1}, *result[1:]], new)
        assert not writer.write_result(0, [*result[:4], {"cam": {"note": 1}}], new)
        actions = [(0, {"pos": np.array([2, 1]), "cam": 3}), (1, {})]
        assert reader.write_request({0: 0, 1: 1}, actions)
        for number, keys in reader.take_unsent():
            writer.in_sets.learn(number, keys)
        assert_same(list(zip(*writer.read_actions())), actions)
        assert not reader.write_request({0: 0}, [(0, {"cam": 1.5})])
    finally:
        reader.close()
        writer.close(unlink=True)


def test_uniform_slots_round_trip_any_agent_order_and_refuse_misfits():
    """Agents sharing one space are written a row at a time: any subset, in any order,
    comes back as it went; bools, huge ints and wrong dtypes still do not fit."""
    env = CheapEnv(num_agents=4, obs_dim=3)
    spec = layout_spec(env, num_envs=2)
    writer = SlotBlock.create(spec, None)
    reader = SlotBlock.attach(spec, writer.name)
    try:
        rows = np.arange(12, dtype=np.float32).reshape(4, 3)
        for keys in (("agent_0", "agent_1", "agent_2", "agent_3"), ("agent_3", "agent_1")):
            result = [
                {key: rows[int(key[-1])] for key in keys},
                dict.fromkeys(keys, 2),  # ints stay ints
                {**dict.fromkeys(keys, False), "agent_1": True, "__all__": False},
                {"__all__": True, **dict.fromkeys(keys, np.False_)},
                {key: {} for key in keys},
            ]
            new = []
            assert writer.write_result(1, result, new)
            for number, known in new:
                reader.in_sets.learn(number, known)
            got = reader.result(reader.read_results(), 1)
            assert_same(result, got)
            assert type(got[1]["agent_1"]) is int
            actions = [(1, dict.fromkeys(keys, 4)), (0, {"agent_2": 1, "agent_0": 0})]
            assert reader.write_request({0: 0, 1: 1}, actions)
            for number, known in reader.take_unsent():
                writer.in_sets.learn(number, known)
            assert_same(list(zip(*writer.read_actions())), actions)
        for misfit in (True, 2**70, np.float32(1.0)):
            assert not reader.write_request({0: 0}, [(0, {"agent_0": 1, "agent_1": misfit})])
        bad_obs = {"agent_0": rows[0], "agent_1": rows[1].astype(np.float64)}
        assert not writer.write_result(0, [bad_obs, *result[1:]], [])
        bad_flags = {"agent_3": 0, "agent_1": False, "__all__": False}
        assert not writer.write_result(0, [result[0], result[1], bad_flags, *result[3:]], [])
    finally:
        reader.close()
        writer.close(unlink=True)


def test_each_field_keeps_its_own_keys_and_known_misfit_key_sets_stay_refused():
    """Rewards, flags and infos may name other agents (or another order) than the obs;
    a key set naming an agent without a slot is refused every time, not only when new."""
    env = CheapEnv(num_agents=3, obs_dim=2)
    spec = layout_spec(env, num_envs=2)
    writer = SlotBlock.create(spec, None)
    reader = SlotBlock.attach(spec, writer.name)
    try:
        rows = np.arange(6, dtype=np.float32).reshape(3, 2)
        result = [
            {"agent_0": rows[0], "agent_2": rows[2]},
            {"agent_2": 0.5, "agent_0": -1.0, "agent_1": 0.0},
            {"agent_0": False, "agent_2": True, "agent_1": True, "__all__": False},
            {"__all__": False},
            {"agent_2": {}},
        ]
        for env_index in (0, 1, 0):
            new = []
            assert writer.write_result(env_index, result, new)
            for number, keys in new:
                reader.in_sets.learn(number, keys)
            assert_same(result, reader.result(reader.read_results(), env_index))
        ghost = {"ghost": False, "__all__": False}
        for _ in range(2):
            assert not writer.write_result(0, [*result[:2], ghost, *result[3:]], [])
            assert not writer.write_result(0, [*result[:3], ghost, result[4]], [])
            assert not writer.write_result(0, [result[0], {"ghost": 1.0}, *result[2:]], [])
    finally:
        reader.close()
        writer.close(unlink=True)
