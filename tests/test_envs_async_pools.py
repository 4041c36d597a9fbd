"""Async pools (`num_envs_per_poll` < `num_envs`): a poll returns the sub-envs that are
ready, so one slow sub-env never stalls the others; every batch invariant holds."""

from __future__ import annotations

import time

import numpy as np
import pytest

from marl_runner import EnvRunner, check_batch_invariants
from marl_runner.envs import EnvError, SubprocessVectorEnv, SyncVectorEnv
from tests.envs import CheapEnv, CrashingEnv, assert_same
from tests.runner_helpers import config
from tests.test_envs_subprocess_vector import a_bit_slow_second_half, mixed_env, play_per_env

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

KAZ = "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"
SPREAD = "mpe2.simple_spread_v3:parallel_env"


def first_step_hangs_in_env_0(index: int) -> CrashingEnv:
    """Sub-env 0's first step takes 3 s (then it goes on normally); the others are quick."""
    return CrashingEnv(crash_step=1 if index == 0 else None, step_crashes=1, fault="hang", hang_s=3)


def cheap(index: int) -> CheapEnv:
    return CheapEnv(num_agents=2, episode_len=4)


@pytest.mark.slow
def test_a_slow_sub_env_never_stalls_the_others():
    with SubprocessVectorEnv(
        first_step_hangs_in_env_0, 4, seed=0, num_workers=4, num_envs_per_poll=2
    ) as vec:
        vec.poll()
        vec.send_actions({env_id: {"a0": 0, "a1": 0} for env_id in range(4)})
        steps = dict.fromkeys(range(4), 0)
        deadline = time.monotonic() + 60
        while steps[0] == 0 and time.monotonic() < deadline:
            obs, _, terminateds, truncateds, _, _ = vec.poll()
            assert len(obs) >= 2 or steps[0] == 0  # at least 2, unless only env 0 is left
            actions = {}
            for env_id, env_obs in obs.items():
                assert isinstance(env_obs, dict), env_obs
                steps[env_id] += 1
                if terminateds[env_id]["__all__"] or truncateds[env_id]["__all__"]:
                    vec.try_reset(env_id)
                actions[env_id] = {"a0": 0, "a1": 0}
            vec.send_actions(actions)
    assert steps[0] == 1
    # While env 0 hung for 3 s the others went on (each step takes well under 0.1 s).
    assert min(steps[1], steps[2], steps[3]) >= 10, steps


@pytest.mark.parametrize("num_envs_per_poll", [2, 3])
def test_each_sub_env_gives_the_same_outputs_as_sync(num_envs_per_poll):
    for make_one, num_envs in ((a_bit_slow_second_half, 4), (mixed_env, 3)):
        sync = play_per_env(SyncVectorEnv(make_one, num_envs, seed=3), 12)
        with SubprocessVectorEnv(
            make_one, num_envs, seed=3, num_workers=num_envs, num_envs_per_poll=num_envs_per_poll
        ) as vec:
            assert_same(sync, play_per_env(vec, 12))


@pytest.mark.slow
def test_default_waits_for_every_sub_env_and_async_poll_is_one():
    with SubprocessVectorEnv(cheap, 3, num_workers=3) as vec:
        assert vec.num_envs_per_poll == 3 and not vec.async_poll
    with SubprocessVectorEnv(cheap, 3, num_workers=3, async_poll=True) as vec:
        assert vec.num_envs_per_poll == 1 and vec.async_poll


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs_per_poll": 0}, r"num_envs_per_poll 0: expected an int in \[1, num_envs=3\]"),
        ({"num_envs_per_poll": 4}, r"num_envs_per_poll 4: expected an int in \[1, num_envs=3\]"),
        ({"num_envs_per_poll": 2.0}, r"num_envs_per_poll 2.0: expected an int"),
        ({"num_envs_per_poll": 2, "async_poll": True}, "async_poll and num_envs_per_poll=2"),
    ],
)
def test_bad_num_envs_per_poll_is_named(kwargs, message):
    with pytest.raises(EnvError, match=message):
        SubprocessVectorEnv(cheap, 3, **kwargs)


@pytest.mark.parametrize(
    ("env_name", "env_config", "policies", "mapping"),
    [
        (
            KAZ,
            {"obs_method": "vector", "max_cycles": 60},
            {"archer": {"model": {"type": "mlp", "hidden": [16]}}, "knight": {}},
            {"archer_*": "archer", "knight_*": "knight"},
        ),
        (SPREAD, {"N": 3, "max_cycles": 25}, None, None),
    ],
)
def test_runner_batches_keep_every_invariant(env_name, env_config, policies, mapping):
    cfg = config(
        env_name, env_config=env_config, policies=policies, policy_mapping_fn=mapping,
        vectorize="subprocess", num_envs=4, rollout_fragment_length=25, seed=3,
        num_workers=2, num_envs_per_poll=2,
    )
    with EnvRunner(cfg) as runner:
        assert runner.env.num_envs_per_poll == 2
        for index in range(3):
            batch = runner.sample()
            # later samples continue the episodes of earlier ones
            check_batch_invariants(batch, t_from_zero=index == 0, rollout_fragment_length=25)
            assert batch.env_steps() >= 25 * cfg.num_envs
            for policy_batch in batch.policy_batches.values():
                assert np.isfinite(policy_batch["rewards"]).all()
        assert runner.get_metrics()["num_faulty_episodes"] == 0
