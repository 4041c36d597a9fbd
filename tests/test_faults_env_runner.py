"""Fault injection through EnvRunner (restarts on): healthy episodes come out whole.

One fault per run (CrashingEnv's `fault_token`) of each kind the env layer
handles: an exception, `os._exit` of the worker, a hang past
`sub_env_step_timeout_s`, a KeyboardInterrupt inside a worker's env step. The
runner drops the faulty episode (and, for a killed worker, its worker mates'
episodes), recreates what failed and goes on; every episode in the batch must
be complete (10 steps per agent) with exactly the rewards the env handed out.
"""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner import EnvRunner, check_batch_invariants
from marl_runner.checks import rewards_per_trajectory, trajectory_rows
from tests.runner_helpers import config

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

EPISODE_LEN = 10
#: What a complete CrashingEnv episode gives each agent: 0.1 * (index + 1) per step.
EPISODE_REWARDS = {0: 0.1 * EPISODE_LEN, 1: 0.2 * EPISODE_LEN}


@pytest.mark.parametrize(
    ("vectorize", "fault"),
    [
        ("sync", "raise"),
        ("subprocess", "raise"),
        ("subprocess", "exit"),
        ("subprocess", "hang"),
        ("subprocess", "interrupt"),
    ],
)
def test_a_fault_costs_only_failed_episodes_and_the_rest_are_complete(tmp_path, vectorize, fault):
    cfg = config(
        "tests.envs:CrashingEnv",
        env_config={
            "crash_step": 4,
            "fault": fault,
            "hang_s": 30.0,
            "episode_len": EPISODE_LEN,
            "fault_token": str(tmp_path / "fault-token"),
        },
        vectorize=vectorize,
        num_envs=3,
        batch_mode="complete_episodes",
        restart_failed_sub_environments=True,
        sub_env_step_timeout_s=0.5,
        seed=4,
    )
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=8)
        metrics = runner.get_metrics()
        again = runner.sample(num_episodes=2)  # still usable
    assert (tmp_path / "fault-token").exists()  # the fault did happen
    assert metrics["num_faulty_episodes"] >= 1
    for sample in (batch, again):
        check_batch_invariants(sample)
        totals = rewards_per_trajectory(sample)
        episodes = {eps_id for eps_id, _ in totals}
        assert len(episodes) >= 2
        for (_, agent_index), total in totals.items():
            assert total == pytest.approx(EPISODE_REWARDS[agent_index])
        for policy_batch in sample.policy_batches.values():
            for rows in trajectory_rows(policy_batch).values():
                assert len(rows) == EPISODE_LEN
                assert np.asarray(policy_batch["terminateds"])[rows][-1]
