"""TorchPolicy.evaluate: what a trainer recomputes from a batch matches what sampling stored."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_runner import EnvRunner, SampleBatch, TorchPolicy
from marl_runner.policy.action_heads import FLOAT_MIN
from marl_runner.policy.sequences import sequence_lengths
from tests.runner_helpers import config

TESTING = "tests.envs"
MLP = {"type": "mlp", "hidden": [16]}
LSTM = {"type": "lstm", "hidden": [8], "lstm_cell_size": 8}
RUNNER_CASES = {
    "discrete-dict-mask": (f"{TESTING}:DictObsEnv", MLP, {}),
    "discrete-info-mask": (f"{TESTING}:MaskInfoEnv", MLP, {}),
    "multidiscrete": (f"{TESTING}:MultiDiscreteEnv", MLP, {}),
    "box": (f"{TESTING}:BoxActionEnv", MLP, {}),
    "lstm-masked": (f"{TESTING}:DictObsEnv", LSTM, {}),
    "prev-actions-rewards": (
        f"{TESTING}:MultiDiscreteEnv",
        MLP,
        {"view_requirements": {"prev_actions": {}, "prev_rewards": {}}},
    ),
}


def _sampled(case: str) -> tuple[TorchPolicy, SampleBatch]:
    env, model, policy_config = RUNNER_CASES[case]
    policies = {"shared": {"model": model, "config": {"gae": True, **policy_config}}}
    with EnvRunner(config(env, policies=policies, rollout_fragment_length=30)) as runner:
        batch = runner.sample().policy_batches["shared"]
        return runner.policy_map["shared"], batch


@pytest.mark.parametrize("case", sorted(RUNNER_CASES))
def test_evaluate_reproduces_the_stored_logp_and_values(case: str) -> None:
    policy, batch = _sampled(case)
    if case.startswith("discrete"):
        assert "action_mask" in batch and not np.all(batch["action_mask"])
    if case.startswith("lstm"):
        assert np.all(batch["seq_lens"] == 1) and np.any(batch["state_in_0"] != 0)
    logp, entropy, values = policy.evaluate(batch)
    assert logp.shape == entropy.shape == values.shape == (len(batch),)
    np.testing.assert_allclose(logp.detach().numpy(), batch["action_logp"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), batch["vf_preds"], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(entropy).all()


def test_rows_evaluate_the_same_shuffled() -> None:
    policy, batch = _sampled("lstm-masked")
    order = np.random.default_rng(0).permutation(len(batch))
    shuffled = SampleBatch({key: value[order] for key, value in batch.items()})
    logp, _, _ = policy.evaluate(shuffled)
    np.testing.assert_allclose(logp.detach().numpy(), batch["action_logp"][order], atol=1e-5)


def test_masked_actions_get_no_probability_and_no_entropy() -> None:
    policy = TorchPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4), {"seed": 0})
    mask = np.array([[1, 0, 1, 0], [0, 0, 1, 0]], np.int8)
    batch = {"obs": np.zeros((2, 3), np.float32), "action_mask": mask, "actions": np.array([1, 2])}
    logp, entropy, _ = (t.detach().numpy() for t in policy.evaluate(batch))
    assert logp[0] < FLOAT_MIN / 2  # action 1 is masked in row 0
    assert logp[1] == pytest.approx(0.0, abs=1e-6)  # the only allowed action is certain
    assert entropy[1] == pytest.approx(0.0, abs=1e-6)
    assert entropy[0] == pytest.approx(np.log(2), abs=1e-3)  # near-uniform over 2 allowed


@pytest.mark.parametrize(
    "space",
    [gym.spaces.Discrete(5), gym.spaces.MultiDiscrete([3, 2, 4]), gym.spaces.Box(-1, 1, (3,))],
    ids=["discrete", "multidiscrete", "box"],
)
def test_entropy_matches_torch_distributions(space: gym.Space) -> None:
    policy = TorchPolicy(gym.spaces.Box(-1, 1, (4,)), space, {"seed": 0})
    with torch.no_grad():
        policy.model.logits.weight.normal_()  # far from uniform
        if isinstance(space, gym.spaces.Box):
            policy.action_head.log_std.copy_(torch.tensor([-1.0, 0.0, 0.5]))
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float32)
    actions, _, extra = policy.compute_actions_from_input_dict({"obs": obs})
    _, entropy, _ = policy.evaluate({"obs": obs, "actions": actions})
    dist_inputs = torch.from_numpy(extra["action_dist_inputs"])
    if isinstance(space, gym.spaces.Discrete):
        expected = torch.distributions.Categorical(logits=dist_inputs).entropy()
    elif isinstance(space, gym.spaces.MultiDiscrete):
        parts = dist_inputs.split(space.nvec.tolist(), dim=-1)
        expected = sum(torch.distributions.Categorical(logits=p).entropy() for p in parts)
    else:
        mean, log_std = dist_inputs.chunk(2, dim=-1)
        expected = torch.distributions.Normal(mean, log_std.exp()).entropy().sum(-1)
    np.testing.assert_allclose(entropy.detach().numpy(), expected.numpy(), rtol=1e-5)


@pytest.mark.parametrize("case", ["discrete-dict-mask", "box", "lstm-masked"])
def test_gradients_reach_every_parameter(case: str) -> None:
    policy, batch = _sampled(case)
    logp, entropy, values = policy.evaluate(batch)
    advantages = torch.from_numpy(batch["advantages"])
    targets = torch.from_numpy(batch["value_targets"])
    loss = -(logp * advantages).mean() - 0.01 * entropy.mean() + (values - targets).pow(2).mean()
    loss.backward()
    named = dict(policy.network.named_parameters())
    assert {id(p) for p in policy.parameters()} == {id(p) for p in named.values()}
    for name, param in named.items():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_a_gradient_step_makes_the_stored_actions_more_likely() -> None:
    policy, batch = _sampled("discrete-dict-mask")
    before, _, _ = policy.evaluate(batch)
    optimiser = torch.optim.SGD(policy.parameters(), lr=0.5)
    (-before.mean()).backward()
    optimiser.step()
    with torch.no_grad():
        after, _, _ = policy.evaluate(batch)
    assert after.mean() > before.mean() + 1e-3


def test_evaluate_errors_name_the_column() -> None:
    policy = TorchPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), {"model": LSTM})
    rows = {"obs": np.zeros((2, 3), np.float32), "actions": np.array([0, 1])}
    with pytest.raises(ValueError, match="'state_in_0'"):
        policy.evaluate(rows)
    state = np.zeros((2, 8), np.float32)
    with pytest.raises(
        ValueError, match=r"seq_lens column must be ones.*\[2\].*evaluate\(batch, seq_lens="
    ):
        policy.evaluate({**rows, "state_in_0": state, "state_in_1": state, "seq_lens": [2, 2]})
    with pytest.raises(ValueError, match="'actions'"):
        policy.evaluate({"obs": rows["obs"], "state_in_0": state, "state_in_1": state})


def test_lstm_sequences_reproduce_the_stored_logp_and_carry_gradients_through_time() -> None:
    policy, batch = _sampled("lstm-masked")
    seq_lens = sequence_lengths(batch, max_seq_len=4)
    assert seq_lens.sum() == len(batch) and seq_lens.max() == 4
    # Carrying the state from each sequence's first row gives what sampling stored: the
    # runner's state_in columns continue each agent's state step to step.
    logp, _, values = policy.evaluate(batch, seq_lens=seq_lens)
    np.testing.assert_allclose(logp.detach().numpy(), batch["action_logp"], atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), batch["vf_preds"], atol=1e-5)

    # Changing the first obs of a sequence changes the next row's outputs only when unrolled.
    first = int(np.flatnonzero(seq_lens >= 2)[0])
    row = int(np.concatenate([[0], np.cumsum(seq_lens)])[first])
    changed = SampleBatch(dict(batch))
    changed["obs"] = batch["obs"].copy()
    changed["obs"][row] += 1.0
    _, _, unrolled = policy.evaluate(changed, seq_lens=seq_lens)
    _, _, per_row = policy.evaluate(changed)
    assert not np.isclose(
        unrolled[row + 1].item(), float(batch["vf_preds"][row + 1]), atol=1e-6
    )
    assert np.isclose(per_row[row + 1].item(), float(batch["vf_preds"][row + 1]), atol=1e-5)


def test_seq_lens_must_cover_the_rows() -> None:
    policy, batch = _sampled("lstm-masked")
    with pytest.raises(ValueError, match=f"summing to the {len(batch)} rows"):
        policy.evaluate(batch, seq_lens=[len(batch) - 1])
    mlp_policy, mlp_batch = _sampled("box")
    logp, _, _ = mlp_policy.evaluate(mlp_batch, seq_lens=sequence_lengths(mlp_batch, 4))
    np.testing.assert_allclose(logp.detach().numpy(), mlp_batch["action_logp"], atol=1e-5)
