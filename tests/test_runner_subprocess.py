"""`vectorize: subprocess` gives the same batches as `sync` for the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner import EnvRunner, SubEnvError, check_batch_invariants, concat_samples
from tests.runner_helpers import config

KAZ = "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"


def _sample(vectorize: str, **extra) -> dict:
    cfg = config(
        KAZ, vectorize=vectorize, num_envs=4, rollout_fragment_length=25, seed=3,
        env_config={"obs_method": "vector", "max_cycles": 60},
        policies={"archer": {"model": {"type": "mlp", "hidden": [16]}}, "knight": {}},
        policy_mapping_fn={"archer_*": "archer", "knight_*": "knight"}, **extra,
    )
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_env_steps=200)
        metrics = runner.get_metrics()
    check_batch_invariants(batch, rollout_fragment_length=25)
    assert metrics["num_faulty_episodes"] == 0
    return batch.policy_batches


@pytest.mark.parametrize("num_workers", [1, 2])
def test_subprocess_batches_equal_sync_batches(num_workers: int) -> None:
    sync = _sample("sync")
    parallel = _sample("subprocess", num_workers=num_workers)
    assert set(sync) == set(parallel)
    for policy_id, batch in sync.items():
        for column in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t"):
            np.testing.assert_array_equal(batch[column], parallel[policy_id][column], err_msg=column)
        # episode ids are random per runner: the same rows share an id in both
        np.testing.assert_array_equal(
            np.unique(batch["eps_id"], return_inverse=True)[1],
            np.unique(parallel[policy_id]["eps_id"], return_inverse=True)[1],
        )


# ---- async_poll: batches depend on timing, but every invariant holds


def _sample_async(cfg, *, fragment: int, calls: int) -> tuple[list, dict, object]:
    batches = []
    with EnvRunner(cfg) as runner:
        for _ in range(calls):
            batches.append(runner.sample())
        metrics = runner.get_metrics()
        stats = runner.env.stats
    for index, batch in enumerate(batches):
        # later samples continue the episodes of earlier ones
        check_batch_invariants(batch, t_from_zero=index == 0, rollout_fragment_length=fragment)
        # sample(): at least one fragment of exactly `fragment` env steps per sub-env
        assert batch.env_steps() >= fragment * cfg.num_envs
    return batches, metrics, stats


def test_async_poll_runner_kaz() -> None:
    cfg = config(
        KAZ,
        vectorize="subprocess",
        num_workers=2,
        async_poll=True,
        num_envs=4,
        rollout_fragment_length=25,
        seed=3,
        env_config={"obs_method": "vector", "max_cycles": 60},
        policies={"archer": {"model": {"type": "mlp", "hidden": [16]}}, "knight": {}},
        policy_mapping_fn={"archer_*": "archer", "knight_*": "knight"},
    )
    batches, metrics, stats = _sample_async(cfg, fragment=25, calls=4)
    assert metrics["num_faulty_episodes"] == 0
    assert metrics["episodes"] >= 1
    assert stats.prefetched_resets >= 1 and stats.reset_round_trips == 0
    assert set(batches[0].policy_batches) == {"archer", "knight"}


def test_async_poll_runner_cheap_env_with_uneven_workers() -> None:
    """Three sub-envs on two workers: the lone sub-env's worker answers sooner,
    so polls hold different sub-env sets; steps and fragments stay exact."""
    cfg = config(
        "marl_runner.bench.envs:CheapEnv",
        vectorize="subprocess",
        num_workers=2,
        async_poll=True,
        num_envs=3,
        rollout_fragment_length=10,
        seed=0,
        env_config={"num_agents": 3, "episode_len": 7},
    )
    batches, metrics, stats = _sample_async(cfg, fragment=10, calls=5)
    assert metrics["num_faulty_episodes"] == 0
    assert stats.reset_round_trips == 0
    total = sum(batch.env_steps() for batch in batches)
    assert total % 10 == 0
    # every env step of every sub-env is in exactly one batch: 3 agents per step
    assert sum(batch.agent_steps() for batch in batches) == 3 * total


def test_async_poll_runner_survives_crashing_sub_envs() -> None:
    """Restarts off: a crash is raised, naming its sub-env, and sampling goes on after it."""
    cfg = config(
        "tests.envs:CrashingEnv",
        vectorize="subprocess",
        num_workers=2,
        async_poll=True,
        num_envs=3,
        rollout_fragment_length=8,
        seed=0,
        env_config={"crash_step": 4, "step_crashes": 1, "episode_len": 6},
    )
    batches, failed = [], []
    with EnvRunner(cfg) as runner:
        while sum(b.env_steps() for b in batches) < 48:
            try:
                batches.append(runner.sample(num_env_steps=8))
            except SubEnvError as error:
                failed.append(error.env_id)
        metrics = runner.get_metrics()
    # Crashes in one round are all recorded; the first is raised.
    assert failed and set(failed) <= {0, 1, 2}
    assert metrics["num_faulty_episodes"] == 3
    batch = concat_samples(batches)
    check_batch_invariants(batch, rollout_fragment_length=8)
    assert metrics["num_faulty_episodes"] == 3  # one crash per sub-env
