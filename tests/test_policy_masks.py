"""Action masks: a masked action is never chosen, by any built-in policy."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_runner.policy import RandomPolicy, TorchPolicy
from marl_runner.policy.action_heads import FLOAT_MIN

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
NUM_ROWS = 4000


def _random_mask(rng: np.random.Generator, widths: list[int]) -> np.ndarray:
    """Random 0/1 masks with at least one allowed entry per dimension of each row."""
    parts = []
    for width in widths:
        mask = (rng.random((NUM_ROWS, width)) < 0.3).astype(np.int8)
        mask[np.arange(NUM_ROWS), rng.integers(width, size=NUM_ROWS)] = 1
        parts.append(mask)
    return np.concatenate(parts, axis=1)


def _make(policy_cls: type, space: gym.Space) -> TorchPolicy | RandomPolicy:
    return policy_cls(OBS_SPACE, space, {"seed": 0})


@pytest.mark.parametrize("policy_cls", [TorchPolicy, RandomPolicy])
@pytest.mark.parametrize("explore", [True, False])
def test_discrete_masked_actions_never_chosen(policy_cls: type, explore: bool) -> None:
    rng = np.random.default_rng(0)
    space = gym.spaces.Discrete(7, start=-3)
    policy = _make(policy_cls, space)
    mask = _random_mask(rng, [7])
    obs = rng.uniform(-1, 1, (NUM_ROWS, 4)).astype(np.float32)
    actions, _, _ = policy.compute_actions_from_input_dict(
        {"obs": obs, "action_mask": mask}, explore=explore
    )
    assert mask[np.arange(NUM_ROWS), actions - space.start].all()


@pytest.mark.parametrize("policy_cls", [TorchPolicy, RandomPolicy])
@pytest.mark.parametrize("explore", [True, False])
def test_multidiscrete_masked_actions_never_chosen(policy_cls: type, explore: bool) -> None:
    rng = np.random.default_rng(1)
    nvec = [3, 5, 2]
    policy = _make(policy_cls, gym.spaces.MultiDiscrete(nvec))
    mask = _random_mask(rng, nvec)
    obs = rng.uniform(-1, 1, (NUM_ROWS, 4)).astype(np.float32)
    actions, _, _ = policy.compute_actions_from_input_dict(
        {"obs": obs, "action_mask": mask}, explore=explore
    )
    offsets = np.array([0, 3, 8])
    assert mask[np.arange(NUM_ROWS)[:, None], actions + offsets].all()


@pytest.mark.parametrize("explore", [True, False])
def test_mask_wins_over_a_huge_logit(explore: bool) -> None:
    """Even when the network strongly prefers a masked action, it is not chosen."""
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(3), {"seed": 0})
    with torch.no_grad():
        policy.model.logits.bias.copy_(torch.tensor([1e30, 0.0, 0.0]))
    mask = np.tile(np.array([0, 1, 1], np.int8), (500, 1))
    actions, _, extra = policy.compute_actions_from_input_dict(
        {"obs": np.zeros((500, 4), np.float32), "action_mask": mask}, explore=explore
    )
    assert (actions != 0).all()
    assert np.isfinite(extra["action_logp"]).all()


def test_logp_and_dist_inputs_reflect_the_mask() -> None:
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(4), {"seed": 0})
    mask = np.array([[1, 0, 1, 0], [0, 0, 0, 1]], np.float32)  # any nonzero value allows
    obs = np.zeros((2, 4), np.float32)
    actions, _, extra = policy.compute_actions_from_input_dict({"obs": obs, "action_mask": mask})
    inputs = extra["action_dist_inputs"]
    assert (inputs[mask == 0] == FLOAT_MIN).all()
    log_probs = torch.log_softmax(torch.from_numpy(inputs), dim=1).numpy()
    np.testing.assert_allclose(extra["action_logp"], log_probs[[0, 1], actions], atol=1e-6)
    # One allowed action: it is certain.
    assert actions[1] == 3 and extra["action_logp"][1] == pytest.approx(0.0, abs=1e-6)
    assert np.exp(log_probs[0, [0, 2]]).sum() == pytest.approx(1.0, abs=1e-6)


def test_random_policy_is_uniform_among_allowed() -> None:
    policy = RandomPolicy(OBS_SPACE, gym.spaces.Discrete(5), {"seed": 0})
    mask = np.tile(np.array([0, 1, 1, 0, 1], np.int8), (30000, 1))
    actions, _, _ = policy.compute_actions_from_input_dict(
        {"obs": np.zeros((30000, 4)), "action_mask": mask}
    )
    counts = np.bincount(actions, minlength=5)
    assert counts[[0, 3]].sum() == 0
    np.testing.assert_allclose(counts[[1, 2, 4]] / 30000, 1 / 3, atol=0.015)


@pytest.mark.parametrize("policy_cls", [TorchPolicy, RandomPolicy])
def test_all_zero_mask_row_is_an_error(policy_cls: type) -> None:
    policy = _make(policy_cls, gym.spaces.Discrete(3))
    mask = np.ones((4, 3), np.int8)
    mask[2] = 0
    with pytest.raises(ValueError, match="action_mask row 2 allows no action"):
        policy.compute_actions_from_input_dict({"obs": np.zeros((4, 4)), "action_mask": mask})


@pytest.mark.parametrize("policy_cls", [TorchPolicy, RandomPolicy])
def test_multidiscrete_dimension_without_allowed_action_is_an_error(policy_cls: type) -> None:
    policy = _make(policy_cls, gym.spaces.MultiDiscrete([2, 3]))
    mask = np.ones((3, 5), np.int8)
    mask[1, 2:] = 0  # row 1 allows nothing in dimension 1
    with pytest.raises(ValueError, match="row 1 allows no action for dimension 1"):
        policy.compute_actions_from_input_dict({"obs": np.zeros((3, 4)), "action_mask": mask})


def test_mask_shape_and_space_errors() -> None:
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(3), {})
    with pytest.raises(ValueError, match=r"expected \(2, 3\)"):
        policy.compute_actions_from_input_dict(
            {"obs": np.zeros((2, 4), np.float32), "action_mask": np.ones((2, 4))}
        )
    box_policy = TorchPolicy(OBS_SPACE, gym.spaces.Box(-1, 1, (2,), np.float32), {})
    with pytest.raises(ValueError, match="only supported for Discrete and MultiDiscrete"):
        box_policy.compute_actions_from_input_dict(
            {"obs": np.zeros((2, 4), np.float32), "action_mask": np.ones((2, 2))}
        )
