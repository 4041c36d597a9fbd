"""Per-round bookkeeping done in bulk (issue 19) gives what the per-row code gave."""

from __future__ import annotations

import numpy as np

from marl_runner import EnvRunner
from marl_runner.sampling.trajectories import _agent_id_strings


def test_agent_id_strings_match_a_per_row_conversion() -> None:
    agent_ids = np.empty(6, object)
    agent_ids[:] = ["player_0", 7, "a_much_longer_agent_name", "b", "x", 0]
    transition_keys = np.array([0, 0, 1, 2, 2, 2, 3, 5, 5])
    segment_ends = np.flatnonzero(np.append(transition_keys[1:] != transition_keys[:-1], True))
    got = _agent_id_strings(agent_ids, transition_keys, segment_ends)
    expected = agent_ids[transition_keys].astype(str)
    assert got.dtype == expected.dtype
    assert got.tolist() == expected.tolist()


def test_bulk_step_counts_match_env_steps_and_episode_lengths() -> None:
    config = {
        "env": {
            "name": "marl_runner.envs.testing:CheapEnv",
            "config": {"num_agents": 3, "episode_len": 7},
            "api": "multi_agent",
        },
        "num_envs": 4,
        "rollout_fragment_length": 5,
        "policies": {"p": {}},
        "policy_mapping_fn": {"*": "p"},
    }
    with EnvRunner(config) as runner:
        batch = runner.sample(num_env_steps=40)
        metrics = runner.get_metrics()
    assert metrics["num_env_steps"] == batch.env_steps() == 40
    assert metrics["episode_len_mean"] == 7.0
    rows = batch.policy_batches["p"]
    # env_t is the episode's env step at the obs, read from the bulk-advanced counts.
    assert rows["env_t"].min() == 0 and rows["env_t"].max() == 6
    assert rows["agent_id"].tolist() == rows["agent_id"].astype(object).astype(str).tolist()
