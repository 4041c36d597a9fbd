"""Pistonball frames through the runner: uint8 from env to batch, stacked per agent, trainable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_runner import EnvRunner, RunnerConfig, SampleBatch, check_batch_invariants, concat_samples

PISTONBALL = "pettingzoo.butterfly.pistonball_v6:parallel_env"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "configs" / "pistonball.yaml"
RANDOM_POLICY = "RandomPolicy"
SMALL_CHAIN = [
    "ObsPreprocessorConnector",
    "GrayscaleAgentConnector",
    {"name": "ResizeAgentConnector", "height": 12, "width": 10},
    "ViewRequirementAgentConnector",
]


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pistonball_config(policy: dict[str, Any], **overrides: Any) -> RunnerConfig:
    """3 pistons, 8-step episodes: short enough that episodes end and restart in a few samples."""
    return RunnerConfig.from_dict(
        {
            "env": {
                "name": PISTONBALL,
                "config": {"n_pistons": 3, "max_cycles": 8, "continuous": False},
            },
            "num_envs": 2,
            "rollout_fragment_length": 6,
            "policies": {"p": policy},
            **overrides,
        }
    )


def sample_sorted(config: RunnerConfig, fragments: int) -> SampleBatch:
    """The policy's rows of a few samples, in (episode, agent, t) order.

    Episode ids are random per runner; ``eps_id`` is replaced by the episode's
    rank (ids count up within a runner), so two runners' batches compare.
    """
    with EnvRunner(config) as runner:
        batch = concat_samples([runner.sample().policy_batches["p"] for _ in range(fragments)])
    order = np.lexsort((batch["t"], batch["agent_index"], batch["eps_id"]))
    rows = {name: column[order] for name, column in batch.items()}
    rows["eps_id"] = np.unique(rows["eps_id"], return_inverse=True)[1]
    return SampleBatch(rows)


def trajectories(batch: SampleBatch) -> list[np.ndarray]:
    key = batch["eps_id"] * 1000 + batch["agent_index"]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return np.split(np.arange(len(batch)), starts[1:])


def test_stacked_frames_are_each_agents_last_k_observations_and_never_leak():
    frames = 3
    stacked_policy = {
        "policy_class": RANDOM_POLICY,
        "agent_connectors": SMALL_CHAIN,
        "config": {"view_requirements": {"obs": {"frames": frames}}},
    }
    plain_policy = {"policy_class": RANDOM_POLICY, "agent_connectors": SMALL_CHAIN}
    # RandomPolicy never looks at the obs: with equal seeds both runners see the same frames.
    stacked = sample_sorted(pistonball_config(stacked_policy), fragments=4)
    plain = sample_sorted(pistonball_config(plain_policy), fragments=4)
    np.testing.assert_array_equal(stacked["eps_id"], plain["eps_id"])
    np.testing.assert_array_equal(stacked["actions"], plain["actions"])
    assert stacked["obs"].dtype == stacked["new_obs"].dtype == np.uint8
    assert stacked["obs"].shape == (len(plain), 12, 10, frames)
    assert plain["obs"].shape == (len(plain), 12, 10, 1)

    episode_starts = 0
    for rows in trajectories(plain):
        if plain["t"][rows[0]] != 0:
            continue  # began before these samples: its first frames are not in the batch
        episode_starts += 1
        seen = plain["obs"][rows]  # this agent's observations, in order, one channel each
        padded = np.concatenate([np.zeros((frames - 1, 12, 10, 1), np.uint8), seen])
        for i, row in enumerate(rows):
            # Channels t-k+1 .. t are exactly this agent's last k obs (zeros before its first).
            expected = np.concatenate(list(padded[i : i + frames]), axis=-1)
            np.testing.assert_array_equal(stacked["obs"][row], expected)
        np.testing.assert_array_equal(stacked["new_obs"][rows][:-1], stacked["obs"][rows][1:])
        np.testing.assert_array_equal(stacked["new_obs"][rows][..., -1:], plain["new_obs"][rows])
    # Sub-envs reset within these samples, so later episodes (same keys, same sub-envs) were
    # checked too: their first rows hold zeros, not the previous episode's frames.
    assert episode_starts > 2 * 3


def test_native_frames_stay_uint8_in_the_batch():
    policy = {"policy_class": RANDOM_POLICY}  # the default chain
    with EnvRunner(pistonball_config(policy, num_envs=1, rollout_fragment_length=4)) as runner:
        assert runner.get_spaces()["p"][0] == gym.spaces.Box(0, 255, (457, 120, 3), np.uint8)
        batch = runner.sample()
    check_batch_invariants(batch)
    rows = batch.policy_batches["p"]
    assert rows["obs"].dtype == rows["new_obs"].dtype == np.uint8
    assert rows["obs"].shape == (len(rows), 457, 120, 3)
    per_row = (rows["obs"].nbytes + rows["new_obs"].nbytes) // len(rows)
    assert per_row == 2 * 457 * 120 * 3  # a quarter of the float32 flat vectors
    assert rows["obs"].any()


def test_example_config_samples_and_takes_a_ppo_step():
    config = RunnerConfig.from_yaml(EXAMPLE).with_overrides(
        ["num_envs=1", "rollout_fragment_length=8", "policies.shared.config.gae={gamma: 0.99}"]
    )
    with EnvRunner(config) as runner:
        assert runner.get_spaces()["shared"][0] == gym.spaces.Box(0, 255, (64, 64, 4), np.uint8)
        batch = runner.sample().policy_batches["shared"]
        policy = runner.policy_map["shared"]
        assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (len(batch), 64, 64, 4)
        assert "advantages" in batch and np.isfinite(batch["advantages"]).all()

        logp, entropy, values = policy.evaluate(batch)
        np.testing.assert_allclose(logp.detach().numpy(), batch["action_logp"], atol=1e-5)
        np.testing.assert_allclose(values.detach().numpy(), batch["vf_preds"], atol=1e-5)
        before = {k: v.copy() for k, v in policy.get_weights().items()}
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
        advantages = torch.from_numpy(batch["advantages"])
        loss = -(logp * advantages).mean() + 0.5 * (values - advantages).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        after = policy.get_weights()
        assert any(not np.array_equal(before[k], after[k]) for k in before)
        runner.sample()  # the updated weights keep sampling


def test_subprocess_workers_hand_over_the_same_frames_as_sync():
    """Frames that arrive through shared memory are copied before the next step reuses it."""
    policy = {"policy_class": RANDOM_POLICY, "agent_connectors": SMALL_CHAIN}
    policy["config"] = {"view_requirements": {"obs": {"frames": 2}}}
    sync = sample_sorted(pistonball_config(policy), fragments=3)
    workers = sample_sorted(pistonball_config(policy, vectorize="subprocess"), fragments=3)
    for column in ("eps_id", "t", "actions", "obs", "new_obs"):
        np.testing.assert_array_equal(workers[column], sync[column], err_msg=column)
    assert workers["obs"].dtype == np.uint8
