"""GAE in TorchPolicy.postprocess_trajectory, checked against hand computations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from marl_runner.batch import SampleBatch
from marl_runner.policy import TorchPolicy
from marl_runner.policy.gae import compute_gae, discounted_cumsum

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
GAMMA, LAMBDA = 0.9, 0.8


def _trajectory(terminated: bool, truncated: bool = False) -> SampleBatch:
    obs = np.arange(12, dtype=np.float32).reshape(4, 3) / 12
    return SampleBatch(
        obs=obs[:3],
        new_obs=obs[1:],
        actions=np.array([0, 1, 0]),
        rewards=np.array([1.0, 0.0, 2.0], np.float32),
        terminateds=np.array([False, False, terminated]),
        truncateds=np.array([False, False, truncated]),
        vf_preds=np.array([0.5, 0.25, -0.5], np.float32),
    )


def _hand_gae(last_value: float) -> tuple[list[float], list[float]]:
    """Written out term by term for rewards [1, 0, 2], values [0.5, 0.25, -0.5]."""
    d0 = 1.0 + GAMMA * 0.25 - 0.5
    d1 = 0.0 + GAMMA * -0.5 - 0.25
    d2 = 2.0 + GAMMA * last_value - -0.5
    gl = GAMMA * LAMBDA
    advantages = [d0 + gl * d1 + gl**2 * d2, d1 + gl * d2, d2]
    return advantages, [a + v for a, v in zip(advantages, [0.5, 0.25, -0.5])]


def _policy(**config: object) -> TorchPolicy:
    return TorchPolicy(
        OBS_SPACE,
        gym.spaces.Discrete(2),
        {"seed": 0, "gae": {"gamma": GAMMA, "lambda": LAMBDA}, **config},
    )


def test_terminated_trajectory_does_not_bootstrap() -> None:
    batch = _policy().postprocess_trajectory(_trajectory(terminated=True))
    advantages, targets = _hand_gae(last_value=0.0)
    np.testing.assert_allclose(batch["advantages"], advantages, rtol=1e-6)
    np.testing.assert_allclose(batch["value_targets"], targets, rtol=1e-6)
    assert batch["advantages"].dtype == np.float32 and len(batch) == 3


@pytest.mark.parametrize("truncated", [True, False], ids=["truncated", "cut-mid-episode"])
def test_unfinished_trajectory_bootstraps_from_last_new_obs(truncated: bool) -> None:
    policy = _policy()
    batch = _trajectory(terminated=False, truncated=truncated)
    _, _, extra = policy.compute_actions_from_input_dict({"obs": batch["new_obs"][-1:]})
    last_value = float(extra["vf_preds"][0])
    assert last_value != 0.0
    policy.postprocess_trajectory(batch)
    advantages, targets = _hand_gae(last_value)
    np.testing.assert_allclose(batch["advantages"], advantages, rtol=1e-5)
    np.testing.assert_allclose(batch["value_targets"], targets, rtol=1e-5)


def test_without_gae_config_the_batch_is_unchanged() -> None:
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(2), {})
    batch = policy.postprocess_trajectory(_trajectory(terminated=True))
    assert "advantages" not in batch


def test_recurrent_bootstrap_uses_the_last_state_out() -> None:
    model = {"type": "lstm", "hidden": [], "lstm_cell_size": 4}
    policy = _policy(model=model)
    batch = _trajectory(terminated=False, truncated=True)
    with pytest.raises(ValueError, match="'state_out_0'"):
        policy.postprocess_trajectory(batch)
    state = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    batch["state_out_0"], batch["state_out_1"] = state, -state
    _, _, extra = policy.compute_actions_from_input_dict(
        {"obs": batch["new_obs"][-1:], "state_in_0": state[-1:], "state_in_1": -state[-1:]}
    )
    policy.postprocess_trajectory(batch)
    np.testing.assert_allclose(
        batch["advantages"], _hand_gae(float(extra["vf_preds"][0]))[0], rtol=1e-5
    )


def test_discounted_cumsum_matches_the_definition() -> None:
    values = np.random.default_rng(0).normal(size=50)
    expected = [sum(0.97**k * values[t + k] for k in range(50 - t)) for t in range(50)]
    np.testing.assert_allclose(discounted_cumsum(values, 0.97), expected, rtol=1e-12)
    assert discounted_cumsum(np.zeros(0), 0.5).shape == (0,)


def test_empty_trajectory() -> None:
    advantages, targets = compute_gae(np.zeros(0), np.zeros(0), 0.0, 0.99, 0.95)
    assert advantages.shape == targets.shape == (0,)


def test_gae_config_errors() -> None:
    with pytest.raises(ValueError, match="'lamda'"):
        TorchPolicy(OBS_SPACE, gym.spaces.Discrete(2), {"gae": {"lamda": 0.9}})
