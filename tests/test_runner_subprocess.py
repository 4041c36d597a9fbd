"""`vectorize: subprocess` gives the same batches as `sync` for the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner import EnvRunner, check_batch_invariants
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
        for column in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t", "eps_id"):
            np.testing.assert_array_equal(batch[column], parallel[policy_id][column], err_msg=column)
