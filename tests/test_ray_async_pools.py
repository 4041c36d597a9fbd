"""`num_envs_per_poll` on RayVectorEnv: the fewest sub-envs a poll waits for (real local Ray)."""

from __future__ import annotations

import pytest

from marl_runner.envs import EnvError
from marl_runner.envs.registry import EnvFactory
from tests.test_ray_envs import TIMED_ENV

SEED = 20


def ray_vector_env(num_envs_per_poll):
    from marl_runner.envs.ray_vector_env import RayVectorEnv

    # sub-env 0 (first seeded SEED) sleeps 0.3 s per step; the others do not sleep
    factory = EnvFactory(
        {"name": TIMED_ENV, "config": {"slow_seed": SEED, "slow_delay_s": 0.3}}
    )
    return RayVectorEnv(factory, 3, seed=SEED, num_envs_per_poll=num_envs_per_poll)


def polled_envs(vec, rounds):
    """Env ids of each poll, acting on everything polled (first poll: the resets)."""
    polls = []
    for _ in range(rounds):
        obs = vec.poll()[0]
        assert all(isinstance(o, dict) for o in obs.values()), obs
        polls.append(sorted(obs))
        vec.send_actions({env_id: {} for env_id in obs})
    return polls


def test_num_envs_per_poll_waits_for_that_many(ray_local):
    vec = ray_vector_env(2)
    try:
        polls = polled_envs(vec, 8)
    finally:
        vec.stop()
    assert all(len(env_ids) >= 2 for env_ids in polls), polls
    # the fast sub-envs went on without the slow one most of the time
    assert sum(0 not in env_ids for env_ids in polls) >= 4, polls


def test_num_envs_per_poll_of_all_polls_every_sub_env_together(ray_local):
    vec = ray_vector_env(3)
    try:
        polls = polled_envs(vec, 4)
    finally:
        vec.stop()
    assert polls == [[0, 1, 2]] * 4


def test_bad_num_envs_per_poll_is_named(ray_local):
    from marl_runner.envs.ray_vector_env import RayVectorEnv

    with pytest.raises(EnvError, match=r"num_envs_per_poll 4: expected an int in \[1, num_envs=3\]"):
        RayVectorEnv(EnvFactory({"name": TIMED_ENV}), 3, num_envs_per_poll=4)
