"""Per-round bookkeeping done in bulk (issue 19) gives what the per-row code gave."""

from __future__ import annotations

from marl_runner import EnvRunner


def test_bulk_step_counts_match_env_steps_and_episode_lengths() -> None:
    config = {
        "env": {
            "name": "marl_runner.bench.envs:CheapEnv",
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
