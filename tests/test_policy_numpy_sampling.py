"""Discrete sampling on CPU runs in numpy: same distribution, log-probs and masks as torch.

The numpy sampler replaces the torch head's post-model work for speed; these
tests pin it to the textbook formulas, to ``evaluate()``'s log-probs, and
check that sampler states (new and old torch ones) restore as documented.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo.classic import connect_four_v3

from marl_runner.policy import TorchPolicy
from marl_runner.policy.action_heads import FLOAT_MIN
from marl_runner.policy.numpy_sampling import NumpyCategoricalSampler

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


def _logits_and_mask(num_rows: int, width: int, scale: float = 3.0):
    rng = np.random.default_rng(num_rows * 100 + width)
    logits = (rng.standard_normal((num_rows, width)) * scale).astype(np.float32)
    mask = rng.random((num_rows, width)) < 0.5
    mask[np.arange(num_rows), rng.integers(width, size=num_rows)] = True
    return logits, mask


@pytest.mark.parametrize("masked", [False, True])
def test_draws_are_gumbel_max_of_the_seeded_uniforms(masked: bool) -> None:
    logits, mask = _logits_and_mask(300, 6)
    mask = mask if masked else None
    actions, _, dist_inputs = NumpyCategoricalSampler(6, 2, seed=7).act(logits, mask, True)
    uniforms = np.random.Generator(np.random.PCG64(7)).random((300, 6), dtype=np.float32)
    gumbel = -np.log(-np.log(np.maximum(uniforms, np.finfo(np.float32).tiny)))
    scores = logits + gumbel
    if masked:
        scores = np.where(mask, scores, -np.inf)
        np.testing.assert_array_equal(dist_inputs, np.where(mask, logits, FLOAT_MIN))
    else:
        assert dist_inputs is logits
    np.testing.assert_array_equal(actions, scores.argmax(axis=1) + 2)


@pytest.mark.parametrize("shape", [(1, 2), (31, 5), (256, 5), (16, 7), (64, 40)])
@pytest.mark.parametrize("explore", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_logp_is_the_torch_log_softmax_of_the_chosen_action(
    shape: tuple[int, int], explore: bool, masked: bool
) -> None:
    """Also for logits far from 0 (the max shift keeps exp finite)."""
    logits, mask = _logits_and_mask(*shape, scale=60.0)
    mask = mask if masked else None
    actions, logp, dist_inputs = NumpyCategoricalSampler(shape[1], 0, seed=1).act(
        logits, mask, explore
    )
    assert logp.dtype == np.float32 and logp.shape == (shape[0],)
    expected = torch.log_softmax(torch.from_numpy(dist_inputs), -1)[
        torch.arange(shape[0]), torch.from_numpy(actions)
    ]
    torch.testing.assert_close(torch.from_numpy(logp), expected, rtol=1e-5, atol=1e-5)
    if not explore:
        allowed = logits if mask is None else np.where(mask, logits, -np.inf)
        np.testing.assert_array_equal(actions, allowed.argmax(axis=1))
    if mask is not None:
        assert mask[np.arange(shape[0]), actions].all()


class _FixedUniforms:
    """Stands in for the sampler's generator: hands out the given uniform draws."""

    def __init__(self, uniforms: np.ndarray) -> None:
        self.uniforms = uniforms

    def random(self, shape: tuple, dtype: type) -> np.ndarray:
        assert shape == self.uniforms.shape and dtype == np.float32
        return self.uniforms.copy()


def test_logp_stays_exact_at_the_noise_clamps_and_with_huge_logits() -> None:
    """The log-prob is shifted by the chosen logit, not the row's max: exploring, the
    chosen one lies at most ~21.2 below the max (the clamped noise's span). Row 0 is that
    extreme (u = 0 on the max, the largest u below 1 on a logit 21 lower, which wins);
    row 1 holds logits near float32's limits."""
    logits = np.array([[0.0, -21.0, -50.0], [3e37, -3e37, 0.0]], np.float32)
    below_one = np.nextafter(np.float32(1.0), np.float32(0.0))
    sampler = NumpyCategoricalSampler(3, 0, seed=0)
    sampler.rng = _FixedUniforms(np.array([[0.0, below_one, 0.5], [0.5, 0.5, 0.5]], np.float32))
    actions, logp, _ = sampler.act(logits, None, True)
    np.testing.assert_array_equal(actions, [1, 0])
    as_float64 = logits.astype(np.float64)
    expected = as_float64[[0, 1], actions] - np.array(
        [np.log(np.exp(row - row.max()).sum()) + row.max() for row in as_float64]
    )
    np.testing.assert_allclose(logp, expected, rtol=1e-6, atol=1e-6)


def test_frequencies_follow_the_masked_softmax() -> None:
    num_rows = 40_000
    logits = np.tile(np.array([[2.0, 0.5, -1.0, 1.0, 3.0]], np.float32), (num_rows, 1))
    mask = np.tile(np.array([[True, True, True, True, False]]), (num_rows, 1))
    actions, _, _ = NumpyCategoricalSampler(5, 0, seed=3).act(logits, mask, True)
    frequencies = np.bincount(actions, minlength=5) / num_rows
    expected = torch.softmax(torch.tensor([2.0, 0.5, -1.0, 1.0, -torch.inf]), 0).numpy()
    np.testing.assert_allclose(frequencies, expected, atol=0.01)  # ~4 standard errors
    assert frequencies[4] == 0.0


def test_no_rows() -> None:
    logits = np.zeros((0, 3), np.float32)
    actions, logp, _ = NumpyCategoricalSampler(3, 0, seed=0).act(
        logits, np.zeros((0, 3), bool), True
    )
    assert actions.shape == logp.shape == (0,)


def _connect_four_rows(num_rows: int) -> dict[str, np.ndarray]:
    """Observations and masks of real connect_four positions (random legal play)."""
    env = connect_four_v3.env()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    obs, masks = [], []
    while len(obs) < num_rows:
        observation, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.reset(seed=int(rng.integers(1 << 30)))
            continue
        obs.append(observation["observation"].astype(np.float32))
        masks.append(observation["action_mask"])
        env.step(int(rng.choice(np.flatnonzero(observation["action_mask"]))))
    env.close()
    return {"obs": np.stack(obs), "action_mask": np.stack(masks)}


@pytest.mark.parametrize("explore", [True, False])
def test_connect_four_policy_honours_masks_and_evaluate_agrees(explore: bool) -> None:
    rows = _connect_four_rows(120)
    space = gym.spaces.Box(0, 1, rows["obs"].shape[1:], np.float32)
    policy = TorchPolicy(space, gym.spaces.Discrete(7), {"seed": 5})
    actions, _, extra = policy.compute_actions_from_input_dict(rows, explore=explore)
    assert actions.dtype == np.int64
    assert rows["action_mask"][np.arange(len(actions)), actions].all()
    logp, _, values = policy.evaluate({**rows, "actions": actions})
    np.testing.assert_allclose(logp.detach().numpy(), extra["action_logp"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), extra["vf_preds"], rtol=1e-6, atol=1e-6)
    again = TorchPolicy(space, gym.spaces.Discrete(7), {"seed": 5})
    np.testing.assert_array_equal(
        again.compute_actions_from_input_dict(rows, explore=explore)[0], actions
    )


def test_state_round_trips_mid_stream() -> None:
    obs = {"obs": np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)}
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(5, start=1), {"seed": 3})
    policy.compute_actions_from_input_dict(obs)
    state = policy.get_state()
    assert state["sampler_rng_state"].dtype == np.uint64
    expected = [policy.compute_actions_from_input_dict(obs)[0] for _ in range(3)]
    clone = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(5, start=1), {"seed": 4})
    clone.set_state(state)
    for want in expected:
        np.testing.assert_array_equal(clone.compute_actions_from_input_dict(obs)[0], want)


def test_a_state_saved_with_a_torch_generator_still_loads() -> None:
    """Policies saved before the numpy sampler stored torch's byte state: it seeds the
    numpy generator, the same saved state giving the same actions."""
    obs = {"obs": np.random.default_rng(0).uniform(-1, 1, (256, 4)).astype(np.float32)}
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(5), {"seed": 3})
    old_state = {
        "weights": policy.get_weights(),
        "sampler_rng_state": torch.Generator().manual_seed(9).get_state().numpy(),
    }
    drawn = []
    for _ in range(2):
        restored = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(5), {"seed": 8})
        restored.set_state(old_state)
        drawn.append(restored.compute_actions_from_input_dict(obs)[0])
    np.testing.assert_array_equal(drawn[0], drawn[1])
    other = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(5), {"seed": 8})
    other.set_state(
        {**old_state, "sampler_rng_state": torch.Generator().manual_seed(10).get_state().numpy()}
    )
    assert not np.array_equal(other.compute_actions_from_input_dict(obs)[0], drawn[0])


@pytest.mark.parametrize(
    "bad", [np.zeros(6, np.int64), np.zeros(5, np.uint64), np.zeros((2, 3), np.uint8)]
)
def test_a_malformed_sampler_state_is_an_error(bad: np.ndarray) -> None:
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(5), {"seed": 3})
    with pytest.raises(ValueError, match=r"sampler_rng_state has dtype .* expected uint64 \(6,\)"):
        policy.set_state({"weights": policy.get_weights(), "sampler_rng_state": bad})


def test_multidiscrete_keeps_the_torch_generator_state() -> None:
    policy = TorchPolicy(OBS_SPACE, gym.spaces.MultiDiscrete([3, 4]), {"seed": 3})
    assert policy.get_state()["sampler_rng_state"].dtype == np.uint8


def test_a_torch_path_policy_takes_a_state_of_another_generator_kind() -> None:
    """A checkpoint moving between devices or heads carries a state the generator cannot
    continue (numpy words; a CPU torch state on CUDA is the same case): it seeds it."""
    numpy_words = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(4), {"seed": 1}).get_state()[
        "sampler_rng_state"
    ]
    obs = {"obs": np.zeros((64, 4), np.float32)}
    draws = []
    for _ in range(2):
        policy = TorchPolicy(OBS_SPACE, gym.spaces.MultiDiscrete([3, 4]), {"seed": 3})
        policy.set_state({"weights": policy.get_weights(), "sampler_rng_state": numpy_words})
        draws.append(policy.compute_actions_from_input_dict(obs)[0])
    np.testing.assert_array_equal(draws[0], draws[1])
    foreign_bytes = np.arange(16, dtype=np.uint8)  # e.g. a CUDA (Philox) generator's state
    policy.set_state({"weights": policy.get_weights(), "sampler_rng_state": foreign_bytes})
    with pytest.raises(ValueError, match="sampler_rng_state has dtype float64"):
        policy.set_state({"weights": policy.get_weights(), "sampler_rng_state": np.zeros(3)})
