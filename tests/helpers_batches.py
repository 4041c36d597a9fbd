"""Real batches from PettingZoo envs and a strict equality check, for the batch-file tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from marl_runner import EnvRunner, MultiAgentBatch, RunnerConfig

KAZ = {
    "env": {
        "name": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
        "config": {"obs_method": "vector", "max_cycles": 40},
    },
    "num_envs": 2,
    "rollout_fragment_length": 60,
    "seed": 0,
    "policies": {"archer": {"model": {"hidden": [16]}}, "knight": {"model": {"hidden": [16]}}},
    "policy_mapping_fn": {"archer_*": "archer", "knight_*": "knight"},
}

# Connect Four with the default chain: obs flattened to float32 [84], an int8 action_mask column.
CONNECT_FOUR = {
    "env": {"name": "pettingzoo.classic.connect_four_v3:env", "api": "aec"},
    "num_envs": 2,
    "batch_mode": "complete_episodes",
    "rollout_fragment_length": 60,
    "seed": 0,
    "policies": {"player_0": {"model": {"hidden": [16]}}, "player_1": {"model": {"hidden": [16]}}},
    "policy_mapping_fn": {"player_0": "player_0", "player_1": "player_1"},
}

# Connect Four without connectors: the Dict obs (observation, action_mask) reaches the batch.
CONNECT_FOUR_DICT_OBS = {
    **CONNECT_FOUR,
    "policies": {
        pid: {"policy_class": "marl_runner.policy:RandomPolicy", "agent_connectors": []}
        for pid in ("player_0", "player_1")
    },
}


def sample(config: dict[str, Any], batches: int = 1) -> tuple[list[MultiAgentBatch], dict]:
    """``batches`` samples of a fresh runner and its ``parquet_metadata``."""
    from marl_runner.io.parquet import parquet_metadata

    with EnvRunner(RunnerConfig.from_dict(config)) as runner:
        out = [runner.sample() for _ in range(batches)]
        return out, parquet_metadata(runner)


def assert_batches_equal(a: MultiAgentBatch, b: MultiAgentBatch) -> None:
    """Same env steps, policies, column names and order, values, dtypes and nesting."""
    assert a.env_steps() == b.env_steps()
    assert list(a.policy_batches) == list(b.policy_batches)
    for pid, batch in a.policy_batches.items():
        other = b.policy_batches[pid]
        assert list(batch) == list(other), pid
        for name in batch:
            assert_values_equal(batch[name], other[name], f"{pid}/{name}")


def assert_values_equal(x: Any, y: Any, where: str) -> None:
    assert type(x) is type(y), f"{where}: {type(x).__name__} != {type(y).__name__}"
    if isinstance(x, dict):
        assert list(x) == list(y), where
        for key in x:
            assert_values_equal(x[key], y[key], f"{where}/{key}")
    elif isinstance(x, (tuple, list)):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            assert_values_equal(u, v, f"{where}/{i}")
    elif isinstance(x, (np.ndarray, np.generic)):
        assert x.dtype == y.dtype, f"{where}: {x.dtype} != {y.dtype}"
        assert x.shape == y.shape, f"{where}: {x.shape} != {y.shape}"
        if x.dtype == object:
            for i, (u, v) in enumerate(zip(x, y)):
                assert_values_equal(u, v, f"{where}[{i}]")
        else:
            np.testing.assert_array_equal(x, y, err_msg=where)
    else:
        assert x == y, f"{where}: {x!r} != {y!r}"
