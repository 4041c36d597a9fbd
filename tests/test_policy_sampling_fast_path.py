"""The sampling fast path of the categorical head gives the textbook values.

Sampling and log-probs are written as few in-place torch ops as possible for
speed; these tests pin them to the plain formulas, so a faster rewrite can
never change which action a seed draws or what log-prob a row stores.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from connectors.data import AgentRows
from marl_runner.policy.action_heads import (
    ActionHead,
    CategoricalHead,
    DiagGaussianHead,
    MultiCategoricalHead,
)
from marl_runner.policy.action_spaces import check_action_mask
from marl_runner.sampling.policy_outputs import stored_columns


def test_sampled_actions_are_gumbel_max_of_the_seeded_uniforms() -> None:
    head = CategoricalHead(gym.spaces.Discrete(6, start=2))
    logits = torch.randn(300, 6, generator=torch.Generator().manual_seed(1))
    mask = torch.rand(300, 6, generator=torch.Generator().manual_seed(2)) < 0.6
    mask[:, 3] = True
    actions = head.sample(
        head.distribution_inputs(logits, mask), mask, True, torch.Generator().manual_seed(7)
    )
    uniform = torch.rand(300, 6, generator=torch.Generator().manual_seed(7))
    gumbel = -torch.log(-torch.log(uniform.clamp(min=torch.finfo(torch.float32).tiny)))
    expected = (logits + gumbel).masked_fill(~mask, -torch.inf).argmax(-1) + 2
    assert torch.equal(actions, expected)


@pytest.mark.parametrize("num_rows", [1, 31, 32, 127, 600])
@pytest.mark.parametrize("num_actions", [2, 5, 7, 15, 16, 40])
def test_log_prob_of_a_row_does_not_depend_on_the_batch_size(
    num_rows: int, num_actions: int
) -> None:
    """A row's stored log-prob is the textbook value whether the policy saw it alone or
    among hundreds, on either side of the narrow-row kernel switch (float rounding apart)."""
    head = CategoricalHead(gym.spaces.Discrete(num_actions))
    logits = torch.randn(num_rows, num_actions, generator=torch.Generator().manual_seed(3)) * 4
    actions = torch.randint(num_actions, (num_rows,), generator=torch.Generator().manual_seed(4))
    batched = head.log_prob(logits, actions)
    alone = torch.cat(
        [head.log_prob(logits[i : i + 1], actions[i : i + 1]) for i in range(num_rows)]
    )
    torch.testing.assert_close(batched, alone, rtol=1e-6, atol=1e-6)
    expected = torch.log_softmax(logits, -1)[torch.arange(num_rows), actions]
    torch.testing.assert_close(batched, expected, rtol=1e-6, atol=1e-6)


def _heads() -> list[tuple[ActionHead, int, bool]]:
    """(head, model outputs, takes a mask) for each action space the policy supports."""
    return [
        (CategoricalHead(gym.spaces.Discrete(5, start=1)), 5, True),
        (MultiCategoricalHead(gym.spaces.MultiDiscrete([3, 4])), 7, True),
        (DiagGaussianHead(gym.spaces.Box(-1.0, 1.0, (2, 3))), 6, False),
    ]


@pytest.mark.parametrize("num_rows", [3, 300])
@pytest.mark.parametrize("explore", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_act_equals_the_three_steps(num_rows: int, explore: bool, masked: bool) -> None:
    """The policy's one call per round gives what distribution_inputs, sample and log_prob
    give in turn, for the same generator state: same actions, log-probs and inputs."""
    for head, width, takes_mask in _heads():
        if masked and not takes_mask:
            continue
        model_out = torch.randn(num_rows, width, generator=torch.Generator().manual_seed(5))
        mask = None
        if masked:
            mask = torch.rand(num_rows, width, generator=torch.Generator().manual_seed(6)) < 0.5
            mask[:, [0, width - 1]] = True  # every row (and MultiDiscrete dim) allows one
        with torch.inference_mode():
            actions, logp, dist_inputs = head.act(
                model_out, mask, explore, torch.Generator().manual_seed(7)
            )
            inputs = head.distribution_inputs(model_out, mask)
            expected = head.sample(inputs, mask, explore, torch.Generator().manual_seed(7))
            assert torch.equal(dist_inputs, inputs)
            assert torch.equal(actions, expected)
            assert torch.equal(logp, head.log_prob(inputs, expected))


def test_masked_logits_get_the_lowest_float_and_stay_differentiable() -> None:
    head = CategoricalHead(gym.spaces.Discrete(3))
    logits = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[True, False, True], [False, True, False]])
    inputs = head.distribution_inputs(logits, mask)
    assert inputs[~mask].eq(torch.finfo(torch.float32).min).all()
    head.log_prob(inputs, torch.tensor([0, 1])).sum().backward()
    assert logits.grad is not None and logits.grad[~mask].eq(0).all()


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.float32])
def test_check_action_mask_passes_good_masks_and_names_the_first_empty_row(dtype: type) -> None:
    space = gym.spaces.Discrete(3)
    good = np.array([[1, 0, 0], [0, 1, 1]], dtype=dtype)
    allowed = check_action_mask(good, space, 2)
    assert allowed.dtype == np.bool_
    assert allowed.tolist() == [[True, False, False], [False, True, True]]
    bad = np.array([[1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=dtype)
    with pytest.raises(ValueError, match=r"row 1 allows no action \(2 of 3 rows"):
        check_action_mask(bad, space, 3)


def test_stored_infos_keep_each_rows_info_as_it_is() -> None:
    """Infos that are equal-length sequences stay one object per row, not a 2-D array."""
    infos = [(1, 2), (3, 4), (5, 6)]
    rows = AgentRows(
        {"obs": np.zeros((3, 2)), "infos": infos, "keys": np.arange(3), "t": np.zeros(3, int)}
    )
    column = stored_columns(rows)["infos"]
    assert column.shape == (3,) and column.dtype == object and list(column) == infos
