"""SyncVectorEnv and make_vector_env: poll protocol, seeding, fault isolation, checks."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from marl_runner.envs import EnvError, SyncVectorEnv, make_vector_env
from marl_runner.envs.vectorize import VECTORIZE_MODES
from tests.envs import (
    CheapEnv,
    CrashingEnv,
    CrashingEnvError,
    MalformedEnv,
    NoObsEnv,
    assert_same,
    play_vector_env,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

ACT = {"a0": 0, "a1": 0}


def cheap(index: int) -> CheapEnv:
    return CheapEnv(num_agents=2, episode_len=15)


def test_first_poll_returns_every_seeded_reset():
    vec = SyncVectorEnv(cheap, 3, seed=10)
    obs, rewards, terminateds, truncateds, infos, off_policy = vec.poll()
    assert list(obs) == [0, 1, 2]
    assert rewards == {0: {}, 1: {}, 2: {}} and off_policy == {0: {}, 1: {}, 2: {}}
    assert all(
        flags == {"__all__": False} for flags in [*terminateds.values(), *truncateds.values()]
    )
    for env_id in range(3):
        expected, _ = cheap(env_id).reset(seed=10 + env_id)
        np.testing.assert_array_equal(obs[env_id]["agent_1"], expected["agent_1"])
    assert set(infos[0]) == {"agent_0", "agent_1"}


def test_same_seed_same_run_across_episodes():
    def run(seed):
        return play_vector_env(SyncVectorEnv(cheap, 3, seed=seed), 50)

    first, again, other = run(1), run(1), run(2)
    assert sum(len(resets) for _, resets in first) == 9  # episodes ended and were reset
    assert_same(first, again)
    with pytest.raises(AssertionError):
        assert_same(first, other)


def test_step_exception_only_affects_its_sub_env():
    vec = SyncVectorEnv(lambda i: CrashingEnv(crash_step=2 if i == 1 else None), 3, seed=0)
    vec.poll()
    vec.send_actions(dict.fromkeys(range(3), ACT))
    vec.poll()
    vec.send_actions(dict.fromkeys(range(3), ACT))
    obs, rewards, terminateds, truncateds, infos, _ = vec.poll()
    assert isinstance(obs[1], CrashingEnvError)
    assert terminateds[1] == {"__all__": True} and rewards[1] == {} and infos[1] == {}
    for env_id in (0, 2):
        assert set(obs[env_id]) == {"a0", "a1"} and terminateds[env_id]["__all__"] is False
    crashed = vec.get_sub_environments()[1]
    reset_obs, _ = vec.try_reset(1)
    assert set(reset_obs) == {"a0", "a1"}
    assert vec.get_sub_environments()[1] is crashed  # no restarts asked for


def test_failed_reset_is_returned_not_raised():
    vec = SyncVectorEnv(lambda i: CrashingEnv(reset_crashes=2), 1, seed=0)
    obs, _, terminateds, _, infos, _ = vec.poll()
    assert isinstance(obs[0], CrashingEnvError) and terminateds[0]["__all__"] is True
    obs, infos = vec.try_reset(0)
    assert isinstance(obs, CrashingEnvError) and infos == {}
    obs, infos = vec.try_reset(0)
    assert set(obs) == {"a0", "a1"}


def test_restart_failed_recreates_the_sub_env_and_reseeds_it():
    vec = SyncVectorEnv(lambda i: CrashingEnv(crash_step=1), 2, seed=5, restart_failed=True)
    vec.poll()
    vec.send_actions({0: ACT, 1: ACT})
    assert isinstance(vec.poll()[0][0], CrashingEnvError)
    crashed = vec.get_sub_environments()[0]
    obs, _ = vec.try_reset(0)
    assert vec.get_sub_environments()[0] is not crashed
    expected, _ = CrashingEnv().reset(seed=5 + 0 + 2)  # seed + env_id + generation * num_envs
    np.testing.assert_array_equal(obs["a0"], expected["a0"])
    before = vec.get_sub_environments()[1]
    vec.try_restart(1)
    assert vec.get_sub_environments()[1] is not before


@pytest.mark.parametrize(
    ("defect", "message"),
    [
        ("four_values", r"step returned a tuple of 4 .*; expected 5 dicts"),
        (
            "obs_not_dict",
            r"step returned obs as a list of 1 \(str\); expected a dict keyed by agent",
        ),
        ("no_all_terminated", r"step returned terminateds without the '__all__' key"),
        ("no_all_truncated", r"step returned truncateds without the '__all__' key"),
        ("not_a_tuple", r"step returned a NoneType"),
    ],
)
def test_malformed_step_output_raises_naming_the_sub_env(defect, message):
    vec = SyncVectorEnv(lambda i: MalformedEnv("none" if i == 0 else defect), 2)
    vec.poll()
    vec.send_actions({0: {}, 1: {}})
    with pytest.raises(EnvError, match=r"sub-env 1 \(MalformedEnv\): " + message):
        vec.poll()


def test_malformed_reset_output_raises():
    vec = SyncVectorEnv(lambda i: MalformedEnv("reset_obs_only"), 1)
    with pytest.raises(
        EnvError, match=r"sub-env 0 \(MalformedEnv\): reset returned .*expected \(obs, infos\)"
    ):
        vec.poll()


def test_empty_action_dicts_still_step():
    vec = SyncVectorEnv(lambda i: NoObsEnv(), 2)
    assert vec.poll()[0] == {0: {}, 1: {}}
    vec.send_actions({0: {}, 1: {}})
    assert vec.poll()[2] == {0: {"__all__": False}, 1: {"__all__": False}}
    vec.send_actions({1: {}})
    obs, _, terminateds, *_ = vec.poll()
    assert list(obs) == [1] and terminateds[1]["__all__"] is True


def test_send_actions_rejects_unknown_env_ids():
    vec = SyncVectorEnv(cheap, 2)
    with pytest.raises(EnvError, match=r"env_id 2 is not in \[0, 2\)"):
        vec.send_actions({2: {}})
    with pytest.raises(EnvError, match=r"env_id -1"):
        vec.send_actions({-1: {}})


def test_spaces_render_stop():
    with SyncVectorEnv(cheap, 2) as vec:
        assert vec.possible_agents == ["agent_0", "agent_1"]
        assert vec.get_observation_space("agent_0").shape == (16,)
        assert vec.get_action_space("agent_1").n == 5
        assert vec.try_render() is None and len(vec.get_sub_environments()) == 2
    vec.stop()  # twice is fine


def test_make_vector_env_from_any_config_object():
    config = SimpleNamespace(
        env={"name": "marl_runner.bench.envs:CheapEnv", "config": {"num_agents": 2}},
        num_envs=2,
        seed=0,
        vectorize="sync",
        restart_failed_sub_environments=False,
    )
    vec = make_vector_env(config)
    assert isinstance(vec, SyncVectorEnv) and vec.num_envs == 2
    from_dict = make_vector_env(vars(config))
    assert_same(play_vector_env(vec, 20), play_vector_env(from_dict, 20))
    assert VECTORIZE_MODES == ("sync", "subprocess", "ray", "external")
    config.vectorize = "threads"  # unknown: refused before any sub-env (or Ray) starts
    choices = re.escape(str(list(VECTORIZE_MODES)))
    with pytest.raises(EnvError, match=rf"vectorize 'threads': expected one of {choices}"):
        make_vector_env(config)
    with pytest.raises(EnvError, match=r"num_envs 0"):
        make_vector_env({**vars(config), "vectorize": "sync", "num_envs": 0})


@pytest.mark.parametrize(
    "env",
    [
        {"name": "pettingzoo.classic.tictactoe_v3:env"},
        {
            "name": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
            "config": {"obs_method": "vector", "max_cycles": 40},
        },
        {"name": "mpe2.simple_spread_v3:parallel_env", "config": {"max_cycles": 10}},
    ],
)
def test_pettingzoo_envs_run_vectorized(env):
    vec = make_vector_env({"env": env, "num_envs": 2, "seed": 0})
    history = play_vector_env(vec, 60)
    assert any(resets for _, resets in history)  # episodes ended and were reset
    vec.stop()
