"""SubprocessVectorEnv: same results as SyncVectorEnv, fault isolation, clean shutdown."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
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
from tests.envs import (
    CheapEnv,
    CrashingEnv,
    CrashingEnvError,
    DyingAgentsEnv,
    action_mask,
    assert_same,
    play_vector_env,
    random_action,
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
            "name": "marl_runner.bench.envs:CheapEnv",
            "config": {"num_agents": 3, "episode_len": 20},
        }
    )
    compare_with_sync(factory, num_envs=5, num_workers=2, rounds=70)


def test_same_results_as_sync_with_big_obs_growing_the_shared_block():
    factory = EnvFactory(
        {
            "name": "marl_runner.bench.envs:CheapEnv",
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


@pytest.mark.slow  # (4-5 s; the mixed and partial-block comparisons run by default)
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
    reset_obs, reset_infos = vec.try_reset(0)  # a failed reset, as BaseEnv says
    assert isinstance(reset_obs, EnvError) and reset_infos == {}
    assert "sub-env 0 cannot be reset: its worker 0 is gone" in str(reset_obs)
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
        old_pids = vec.worker_pids
        assert len(set(old_pids)) == 2 and os.getpid() not in old_pids
        assert set(vec.try_reset(1)[0]) == {"a0", "a1"}
        assert set(vec.try_reset(0)[0]) == {"a0", "a1"}
        new_pids = vec.worker_pids
        assert new_pids[0] != old_pids[0] and new_pids[1] == old_pids[1]  # only worker 0 died
        vec.send_actions(dict.fromkeys(range(4), ACT))
        assert all(isinstance(o, dict) for o in vec.poll()[0].values())


def test_malformed_output_raises_in_the_parent():
    factory = EnvFactory(
        {"name": "tests.envs:MalformedEnv", "config": {"defect": "four_values"}}
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
            EnvFactory({"name": "marl_runner.bench.envs:CheapEnv", "config": {"num_agents": 0}}),
            1,
        )
    with pytest.raises(EnvError, match="cannot be pickled for worker processes"):
        SubprocessVectorEnv(lambda index: CheapEnv(), 2)
    with pytest.raises(EnvError, match=r"num_workers 3: expected an int in \[1, num_envs=2\]"):
        SubprocessVectorEnv(
            EnvFactory({"name": "marl_runner.bench.envs:CheapEnv"}), 2, num_workers=3
        )


def test_stop_leaves_no_processes():
    vec = SubprocessVectorEnv(
        EnvFactory({"name": "tests.envs:DyingAgentsEnv"}), 3, num_workers=3
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


# ---- resets shipped with an episode's last step

CHEAP_SHORT = EnvFactory(
    {"name": "marl_runner.bench.envs:CheapEnv", "config": {"num_agents": 2, "episode_len": 3}}
)


class FlakyResetEnv(CheapEnv):
    """CheapEnv (3-round episodes) whose `bad_reset`-th reset raises, or with
    `malformed` returns only the obs."""

    def __init__(self, bad_reset: int = 2, malformed: bool = False) -> None:
        super().__init__(num_agents=2, episode_len=3)
        self.bad_reset = bad_reset
        self.malformed = malformed
        self.num_resets = 0

    def reset(self, seed=None, options=None):
        self.num_resets += 1
        if self.num_resets == self.bad_reset:
            if self.malformed:
                return (super().reset(seed=seed, options=options)[0],)
            raise CrashingEnvError(f"FlakyResetEnv: reset #{self.num_resets}")
        return super().reset(seed=seed, options=options)


def flaky_reset_env(index: int) -> FlakyResetEnv:
    return FlakyResetEnv(bad_reset=2 if index == 1 else 0)


def malformed_second_reset_env(index: int) -> FlakyResetEnv:
    return FlakyResetEnv(bad_reset=2 if index == 1 else 0, malformed=True)


def step_all(vec, env_ids=None):
    vec.send_actions(
        {env_id: {"agent_0": 0, "agent_1": 0} for env_id in env_ids or range(vec.num_envs)}
    )
    return vec.poll()


def test_resets_travel_with_the_last_step_and_match_sync():
    compare_with_sync(CHEAP_SHORT, num_envs=4, num_workers=2, rounds=13)
    with SubprocessVectorEnv(CHEAP_SHORT, 4, seed=3, num_workers=2) as vec:
        history = play_vector_env(vec, 13)
        resets = sum(len(round_resets) for _, round_resets in history)
        assert resets == 4 * 4  # 3-round episodes: rounds 3, 6, 9, 12
        assert vec.stats.prefetched_resets == resets and vec.stats.reset_round_trips == 0
        # The 13th round's actions go out at once (send_actions sends), unpolled.
        assert vec.stats.env_steps == 12 * 4 and vec.stats.step_requests == 13 * 2


def test_a_failing_prefetched_reset_is_reported_as_before():
    for vec in (
        SyncVectorEnv(flaky_reset_env, 2, seed=0, restart_failed=True),
        SubprocessVectorEnv(flaky_reset_env, 2, seed=0, num_workers=2, restart_failed=True),
    ):
        with vec:
            vec.poll()
            for _ in range(3):
                obs, _, _, truncateds, *_ = step_all(vec)
            assert truncateds[1]["__all__"]
            error, infos = vec.try_reset(1)
            assert isinstance(error, CrashingEnvError) and infos == {}
            assert "reset #2" in str(error)
            if isinstance(vec, SubprocessVectorEnv):
                assert "sub-env 1 (worker 1)" in error.__notes__[0]
            assert set(vec.try_reset(0)[0]) == {"agent_0", "agent_1"}
            obs, _ = vec.try_reset(1)  # recreated (restart_failed), then reset seeded afresh
            assert set(obs) == {"agent_0", "agent_1"}


def test_a_malformed_prefetched_reset_raises_in_try_reset():
    with SubprocessVectorEnv(malformed_second_reset_env, 2, seed=0, num_workers=1) as vec:
        vec.poll()
        for _ in range(3):
            step_all(vec)  # the episode's last step does not raise: the reset is not asked for yet
        assert set(vec.try_reset(0)[0]) == {"agent_0", "agent_1"}
        with pytest.raises(
            EnvError, match=r"sub-env 1 \(FlakyResetEnv\): reset returned a tuple of 1"
        ):
            vec.try_reset(1)


def test_try_reset_with_a_seed_or_options_discards_the_prefetched_reset():
    sync = SyncVectorEnv(CHEAP_SHORT, 3, seed=5)
    with SubprocessVectorEnv(CHEAP_SHORT, 3, seed=5, num_workers=2) as sub:
        for vec in (sync, sub):
            vec.poll()
            for _ in range(3):
                step_all(vec)
        assert_same(sync.try_reset(0, seed=11), sub.try_reset(0, seed=11))
        assert_same(sync.try_reset(1), sub.try_reset(1))
        assert sub.stats.prefetched_resets == 1 and sub.stats.reset_round_trips == 1
        assert set(sub.try_reset(2, options={"x": 1})[0]) == {"agent_0", "agent_1"}
        assert sub.stats.reset_round_trips == 2


# ---- asynchronous polling


class SlowEnv(CheapEnv):
    """CheapEnv whose steps take `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(num_agents=2, episode_len=4)
        self.delay_s = delay_s

    def step(self, actions):
        time.sleep(self.delay_s)
        return super().step(actions)


def slow_second_half(index: int) -> CheapEnv:
    return SlowEnv(0.15) if index >= 2 else CheapEnv(num_agents=2, episode_len=4)


def a_bit_slow_second_half(index: int) -> CheapEnv:
    return SlowEnv(0.005) if index >= 2 else CheapEnv(num_agents=2, episode_len=4)


def play_per_env(vec, polls_per_env: int) -> dict:
    """Drive `vec` until every sub-env appeared in `polls_per_env` polls; each
    sub-env gets actions drawn from its own RNG. Returns per sub-env what it
    handed out, which does not depend on which sub-envs shared a poll."""
    history: dict[int, list] = {env_id: [] for env_id in range(vec.num_envs)}
    rngs = {env_id: np.random.default_rng(env_id) for env_id in range(vec.num_envs)}
    owing = set(range(vec.num_envs))  # sub-envs with a result to come
    while any(len(h) < polls_per_env for h in history.values()):
        obs, rewards, terminateds, truncateds, infos, _ = vec.poll()
        assert obs and set(obs) <= owing, (set(obs), owing)
        owing -= set(obs)
        actions = {}
        for env_id, env_obs in obs.items():
            record = [env_obs, rewards[env_id], terminateds[env_id], truncateds[env_id]]
            env_infos = infos[env_id]
            if terminateds[env_id]["__all__"] or truncateds[env_id]["__all__"]:
                env_obs = None
                while not isinstance(env_obs, dict):
                    env_obs, env_infos = vec.try_reset(env_id)
                    record.append(env_obs)
                live = set(env_obs)
            else:
                live = {
                    a
                    for a in env_obs
                    if not (terminateds[env_id].get(a) or truncateds[env_id].get(a))
                }
            history[env_id].append(record)
            if len(history[env_id]) < polls_per_env:
                actions[env_id] = {
                    agent: random_action(
                        vec.get_action_space(agent),
                        action_mask(env_obs[agent], env_infos.get(agent)),
                        rngs[env_id],
                    )
                    for agent in sorted(live)
                }
        vec.send_actions(actions)
        owing |= set(actions)
    return history


def test_async_poll_returns_the_ready_workers_first():
    with SubprocessVectorEnv(slow_second_half, 4, seed=0, num_workers=2, async_poll=True) as vec:
        assert set(vec.poll()[0]) == {0, 1, 2, 3}  # the first poll: every reset obs
        vec.send_actions({env_id: {"agent_0": 0, "agent_1": 0} for env_id in range(4)})
        assert set(vec.poll()[0]) == {0, 1}  # worker 1 is still stepping
        vec.send_actions({0: {"agent_0": 1}, 1: {}})
        seen = []
        while len(seen) < 2:
            seen.append(set(vec.poll()[0]))
        assert sorted(map(sorted, seen)) == [[0, 1], [2, 3]]
        assert vec.poll()[0] == {}  # nothing in flight: an empty poll, no waiting


def test_a_reset_drops_the_sub_envs_step_result_not_yet_handed_out():
    """The runner gives up a sub-env's episode while its step is in flight (a step that
    raised after the send, with async pools): after `try_reset`, no poll hands out that
    step's result, which would otherwise pass for the new episode's first step."""
    with SubprocessVectorEnv(slow_second_half, 4, seed=0, num_workers=2, async_poll=True) as vec:
        vec.poll()  # every reset obs
        vec.send_actions({env_id: {"agent_0": 0, "agent_1": 0} for env_id in range(4)})
        assert set(vec.poll()[0]) == {0, 1}  # worker 1 is still stepping sub-envs 2 and 3
        reset_obs, _ = vec.try_reset(3)  # reads worker 1's step reply first
        assert not isinstance(reset_obs, BaseException)
        assert set(vec.poll()[0]) == {2}  # sub-env 3's step result was dropped
        vec.send_actions({3: {"agent_0": 0, "agent_1": 0}})
        polled = vec.poll()
        assert set(polled[0]) == {3} and not polled[2][3].get("__all__")


def test_async_poll_gives_each_sub_env_the_same_outputs_as_sync():
    for make_one, num_envs, num_workers in (
        (a_bit_slow_second_half, 4, 2),
        (mixed_env, 3, 2),
        (CHEAP_SHORT, 5, 2),
    ):
        sync = play_per_env(SyncVectorEnv(make_one, num_envs, seed=3), 14)
        with SubprocessVectorEnv(
            make_one, num_envs, seed=3, num_workers=num_workers, async_poll=True
        ) as vec:
            assert_same(sync, play_per_env(vec, 14))


def test_async_poll_with_a_dying_worker():
    with SubprocessVectorEnv(
        worker_dies_in_env_1, 4, seed=0, num_workers=2, async_poll=True, restart_failed=True
    ) as vec:
        errors = {}
        history = play_per_env_until_error(vec, errors)
        assert set(errors) == {0, 1} and all(isinstance(e, EnvError) for e in errors.values())
        assert "running sub-envs [0, 1] died (exit code 3)" in str(errors[0])
        assert history  # the other worker's sub-envs kept stepping
        assert set(vec.try_reset(0)[0]) == {"a0", "a1"}  # the worker is recreated
        vec.send_actions({0: ACT})
        polled: list[int] = []
        while 0 not in polled:
            polled += vec.poll()[0]
        assert sorted(polled) == [0, 2, 3]  # 2 and 3 were still in flight


def play_per_env_until_error(vec, errors: dict) -> list:
    vec.poll()
    vec.send_actions(dict.fromkeys(range(4), ACT))
    history = []
    while len(errors) < 2:
        obs, *_ = vec.poll()
        for env_id, env_obs in obs.items():
            if isinstance(env_obs, Exception):
                errors[env_id] = env_obs
            else:
                history.append(env_id)
        vec.send_actions({env_id: ACT for env_id, o in obs.items() if isinstance(o, dict)})
    return history


def test_async_stop_with_steps_in_flight_leaves_no_processes_or_shared_memory():
    vec = SubprocessVectorEnv(slow_second_half, 4, seed=0, num_workers=2, async_poll=True)
    vec.poll()
    step_all(vec)  # worker 0 answered, worker 1 is still stepping
    step_all(vec, [0, 1])
    blocks = [w.obs_reader.block.name for w in vec._workers if w.obs_reader.block is not None]
    assert blocks
    processes = [worker.process for worker in vec._workers]
    vec.stop()
    assert all(process.exitcode == 0 for process in processes)
    assert not [name for name in blocks if os.path.exists(f"/dev/shm/{name}")]


def test_make_vector_env_reads_async_poll():
    config = SimpleNamespace(
        env={"name": "marl_runner.bench.envs:CheapEnv", "config": {"num_agents": 2}},
        num_envs=2,
        vectorize="subprocess",
        num_workers=2,
        async_poll=True,
    )
    with make_vector_env(config) as vec:
        assert vec.async_poll
    del config.async_poll
    with make_vector_env(config) as vec:
        assert not vec.async_poll


# ---- worker pinning


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_workers_fill_the_cpus_pinned_one_each_else_unpinned():
    allowed = sorted(os.sched_getaffinity(0))
    factory = EnvFactory({"name": "marl_runner.bench.envs:CheapEnv"})
    cases = [(len(allowed), True), (len(allowed), False), (len(allowed) + 1, True)]
    if len(allowed) > 3:
        cases.append((len(allowed) - 2, True))  # spare CPUs: no pinning
    for num_workers, pin in cases:
        with SubprocessVectorEnv(
            factory, num_workers, num_workers=num_workers, pin_workers=pin
        ) as vec:
            pinned = pin and len(allowed) >= 2 and num_workers <= len(allowed) <= num_workers + 1
            for worker in vec._workers:
                affinity = os.sched_getaffinity(worker.process.pid)
                if pinned:
                    assert affinity == {allowed[worker.index]}
                    assert os.sched_getscheduler(worker.process.pid) == os.SCHED_BATCH
                else:
                    assert affinity == set(allowed)
                    assert os.sched_getscheduler(worker.process.pid) == os.SCHED_OTHER
            play_vector_env(vec, 3)
