"""SubprocessVectorEnv: same results as SyncVectorEnv, fault isolation, clean shutdown."""

from __future__ import annotations

import multiprocessing as mp
from types import SimpleNamespace

import numpy as np
import pytest

from marl_runner.envs import (
    EnvError,
    SubprocessVectorEnv,
    SyncVectorEnv,
    make_vector_env,
    register_env,
)
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.shared_obs import SharedObsReader, SharedObsWriter
from marl_runner.envs.testing import (
    CheapEnv,
    CrashingEnv,
    CrashingEnvError,
    DyingAgentsEnv,
    assert_same,
    play_vector_env,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

ACT = {"a0": 0, "a1": 0}


def mixed_env(index: int):
    """Sub-env 1 crashes on step 3 of each episode; the others have dying agents."""
    return CrashingEnv(crash_step=3, episode_len=6) if index == 1 else DyingAgentsEnv()


def worker_dies_in_env_1(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=2 if index == 1 else None, hard_exit=True)


def cheap_creator(config: dict) -> CheapEnv:
    return CheapEnv(**config)


def compare_with_sync(make_one, num_envs, num_workers, rounds, seed=3):
    sync = SyncVectorEnv(make_one, num_envs, seed=seed)
    with SubprocessVectorEnv(make_one, num_envs, seed=seed, num_workers=num_workers) as sub:
        assert_same(play_vector_env(sync, rounds), play_vector_env(sub, rounds))


def test_same_results_as_sync_cheap_env():
    factory = EnvFactory(
        {
            "name": "marl_runner.envs.testing:CheapEnv",
            "config": {"num_agents": 3, "episode_len": 20},
        }
    )
    compare_with_sync(factory, num_envs=5, num_workers=2, rounds=70)


def test_same_results_as_sync_with_big_obs_growing_the_shared_block():
    factory = EnvFactory(
        {
            "name": "marl_runner.envs.testing:CheapEnv",
            "config": {"num_agents": 4, "obs_dim": 6000, "episode_len": 5},
        }
    )
    compare_with_sync(factory, num_envs=4, num_workers=2, rounds=12)


def test_shared_obs_round_trip_in_one_process():
    writer, reader = SharedObsWriter(), SharedObsReader()
    try:
        writer.start_reply()
        small = writer.pack({"a": np.arange(3.0), "b": np.ones(3)})
        big = writer.pack({"a": np.zeros(40_000, np.uint8), "b": np.full(40_000, 7, np.uint8)})
        mixed = {"a": np.zeros(2), "b": np.zeros(3)}
        assert writer.pack(mixed) is mixed and writer.pack({"a": 1, "b": 2}) == {"a": 1, "b": 2}
        reader.attach(writer.new_block_name())
        small_obs, big_obs = reader.unpack(small), reader.unpack(big)
        np.testing.assert_array_equal(small_obs["a"], np.arange(3.0))
        assert big_obs["b"].dtype == np.uint8 and (big_obs["b"] == 7).all()
        writer.start_reply()
        writer.pack({"a": np.arange(3.0), "b": np.ones(3)})
        assert writer.new_block_name() is None  # the block is reused
        big_obs["a"][0] = 1  # copies out of the block are the caller's to change
    finally:
        reader.detach()
        writer.close()


def test_same_results_as_sync_with_crashes_and_turns():
    compare_with_sync(mixed_env, num_envs=3, num_workers=3, rounds=40)


def test_same_results_as_sync_kaz():
    factory = EnvFactory(
        {
            "name": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
            "config": {"obs_method": "vector", "max_cycles": 60},
        }
    )
    compare_with_sync(factory, num_envs=4, num_workers=2, rounds=150)


def test_sub_env_exception_is_an_entry_with_the_worker_traceback():
    with SubprocessVectorEnv(
        lambda_free_crasher, 4, seed=0, num_workers=2, restart_failed=True
    ) as vec:
        vec.poll()
        vec.send_actions(dict.fromkeys(range(4), ACT))
        obs, _, terminateds, truncateds, infos, _ = vec.poll()
        assert isinstance(obs[3], CrashingEnvError) and terminateds[3] == {"__all__": True}
        assert "sub-env 3 (worker 1)" in obs[3].__notes__[0]
        assert "Traceback" in obs[3].__notes__[0]
        assert all(isinstance(obs[i], dict) for i in range(3))
        obs, _ = vec.try_reset(3)  # recreated first (restart_failed), then reset
        assert set(obs) == {"a0", "a1"}


def lambda_free_crasher(index: int) -> CrashingEnv:
    return CrashingEnv(crash_step=1 if index == 3 else None)


def test_dead_worker_fails_only_its_sub_envs():
    vec = SubprocessVectorEnv(worker_dies_in_env_1, 4, seed=0, num_workers=2)
    dead_process = vec._workers[0].process
    vec.poll()
    vec.send_actions(dict.fromkeys(range(4), ACT))
    vec.poll()
    vec.send_actions(dict.fromkeys(range(4), ACT))
    obs, _, terminateds, *_ = vec.poll()
    for env_id in (0, 1):
        assert isinstance(obs[env_id], EnvError) and terminateds[env_id]["__all__"]
        assert f"(pid {dead_process.pid}) running sub-envs [0, 1] died (exit code 3)" in str(
            obs[env_id]
        )
    assert set(obs[2]) == set(obs[3]) == {"a0", "a1"}
    assert dead_process.exitcode == 3  # reaped, not a zombie
    with pytest.raises(EnvError, match="sub-env 0 cannot be reset: its worker 0 died"):
        vec.try_reset(0)
    vec.send_actions({0: ACT, 2: ACT})
    obs, *_ = vec.poll()
    assert isinstance(obs[0], EnvError) and isinstance(obs[2], dict)
    vec.stop()


def test_dead_worker_is_recreated_when_restarts_are_on():
    with SubprocessVectorEnv(
        worker_dies_in_env_1, 4, seed=0, num_workers=2, restart_failed=True
    ) as vec:
        vec.poll()
        for _ in range(2):
            vec.send_actions(dict.fromkeys(range(4), ACT))
            obs, *_ = vec.poll()
        assert isinstance(obs[1], EnvError)
        old_pid = vec._workers[0].process.pid
        assert set(vec.try_reset(1)[0]) == {"a0", "a1"}
        assert set(vec.try_reset(0)[0]) == {"a0", "a1"}
        assert vec._workers[0].process.pid != old_pid
        vec.send_actions(dict.fromkeys(range(4), ACT))
        assert all(isinstance(o, dict) for o in vec.poll()[0].values())


def test_malformed_output_raises_in_the_parent():
    factory = EnvFactory(
        {"name": "marl_runner.envs.testing:MalformedEnv", "config": {"defect": "four_values"}}
    )
    with SubprocessVectorEnv(factory, 3, num_workers=2) as vec:
        vec.poll()
        vec.send_actions({0: {}, 1: {}, 2: {}})
        with pytest.raises(
            EnvError, match=r"sub-env 0 \(MalformedEnv\): step returned a tuple of 4"
        ):
            vec.poll()
        vec.send_actions({2: {}})  # the protocol is still in step after the error
        with pytest.raises(EnvError, match=r"sub-env 2 \(MalformedEnv\)"):
            vec.poll()


def test_creation_failure_and_unpicklable_creator_are_clear():
    with pytest.raises(EnvError, match=r"worker 0 could not create its sub-envs \[0\].*num_agents"):
        SubprocessVectorEnv(
            EnvFactory({"name": "marl_runner.envs.testing:CheapEnv", "config": {"num_agents": 0}}),
            1,
        )
    with pytest.raises(EnvError, match="cannot be pickled for worker processes"):
        SubprocessVectorEnv(lambda index: CheapEnv(), 2)
    with pytest.raises(EnvError, match=r"num_workers 3: expected an int in \[1, num_envs=2\]"):
        SubprocessVectorEnv(
            EnvFactory({"name": "marl_runner.envs.testing:CheapEnv"}), 2, num_workers=3
        )


def test_stop_leaves_no_processes():
    vec = SubprocessVectorEnv(
        EnvFactory({"name": "marl_runner.envs.testing:DyingAgentsEnv"}), 3, num_workers=3
    )
    play_vector_env(vec, 5)
    processes = [worker.process for worker in vec._workers]
    vec.stop()
    vec.stop()
    assert all(process.exitcode == 0 for process in processes)
    assert not [p for p in mp.active_children() if p in processes]


def test_make_vector_env_subprocess_with_a_registered_env():
    register_env("cheap-subprocess-test", cheap_creator)
    config = SimpleNamespace(
        env={"name": "cheap-subprocess-test", "config": {"num_agents": 2, "episode_len": 5}},
        num_envs=3,
        seed=0,
        vectorize="subprocess",
        restart_failed_sub_environments=False,
        num_workers=2,
    )
    with make_vector_env(config) as vec:
        assert isinstance(vec, SubprocessVectorEnv) and len(vec._workers) == 2
        assert vec.possible_agents == ["agent_0", "agent_1"]
        assert vec.get_action_space("agent_0").n == 5
        assert vec.try_render(1) is None
        history = play_vector_env(vec, 12)
    assert sum(len(resets) for _, resets in history) == 6
