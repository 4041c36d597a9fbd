"""The built-in MLP's numpy forward pass (cpu_inference: numpy) against the torch module."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from marl_runner.policy import TorchPolicy
from marl_runner.policy.models import MLPModel
from marl_runner.policy.numpy_mlp import NumpyMLP

OBS = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
ACTIONS = gym.spaces.Discrete(4)


def _rows(n: int = 64, width: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, width)).astype(np.float32)


def _torch_outputs(model: nn.Module, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        logits, values = model(torch.from_numpy(rows))
    return logits.numpy(), values.numpy()


def _bound_model() -> tuple[MLPModel, NumpyMLP, np.ndarray]:
    """A seeded default MLP, its numpy forward, and rows for it."""
    torch.manual_seed(0)
    model = MLPModel(6, 4).eval()
    return model, NumpyMLP(model), _rows()


def _assert_matches_torch(numpy_mlp: NumpyMLP, model: nn.Module, rows: np.ndarray) -> None:
    outputs = numpy_mlp(rows)
    assert outputs is not None, "the numpy forward declined a model it should run"
    expected_logits, expected_values = _torch_outputs(model, rows)
    np.testing.assert_allclose(outputs[0], expected_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs[1], expected_values, rtol=1e-5, atol=1e-6)
    assert outputs[0].dtype == np.float32 and outputs[1].shape == (len(rows),)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"hidden": [32], "activation": "relu"},
        {"hidden": [16, 16, 8], "vf_share_layers": True},
        {"hidden": []},
        {"hidden": [], "vf_share_layers": True},
    ],
)
def test_numpy_forward_equals_the_torch_module(kwargs: dict) -> None:
    torch.manual_seed(0)
    model = MLPModel(6, 4, **kwargs).eval()
    rows = _rows()
    _assert_matches_torch(NumpyMLP(model), model, rows)
    np.testing.assert_array_equal(rows, _rows())  # the input is not written to


def test_policy_outputs_equal_with_numpy_and_torch_inference() -> None:
    rows = {"obs": _rows(200)}
    fast = TorchPolicy(OBS, ACTIONS, {"seed": 3})
    slow = TorchPolicy(OBS, ACTIONS, {"seed": 3, "cpu_inference": "torch"})
    assert fast._numpy_mlp is not None and slow._numpy_mlp is None
    for explore in (True, False):
        actions, _, extra = fast.compute_actions_from_input_dict(rows, explore=explore)
        expected_actions, _, expected = slow.compute_actions_from_input_dict(rows, explore=explore)
        np.testing.assert_array_equal(actions, expected_actions)
        for column in ("action_logp", "action_dist_inputs", "vf_preds"):
            np.testing.assert_allclose(extra[column], expected[column], rtol=1e-5, atol=1e-6)


def test_declared_previous_actions_and_rewards_feed_the_numpy_forward() -> None:
    config = {"seed": 1, "view_requirements": {"prev_actions": {}, "prev_rewards": {}}}
    fast = TorchPolicy(OBS, ACTIONS, config)
    slow = TorchPolicy(OBS, ACTIONS, {**config, "cpu_inference": "torch"})
    rows = {"obs": _rows(10), "prev_actions": np.arange(10) % 4, "prev_rewards": np.linspace(-1, 1, 10)}
    values = fast.compute_actions_from_input_dict(rows, explore=False)[2]["vf_preds"]
    expected = slow.compute_actions_from_input_dict(rows, explore=False)[2]["vf_preds"]
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)


def test_weights_changed_in_place_show_at_once() -> None:
    policy = TorchPolicy(OBS, ACTIONS, {"seed": 0})
    rows = _rows()
    batch = {"obs": rows, "actions": np.zeros(len(rows), np.int64)}
    optimiser = torch.optim.SGD(policy.parameters(), lr=0.5)
    logp, _, values = policy.evaluate(batch)
    (values.square().mean() - logp.mean()).backward()
    optimiser.step()
    _assert_matches_torch(policy._numpy_mlp, policy.model, rows)

    other = TorchPolicy(OBS, ACTIONS, {"seed": 9})
    other.set_weights(policy.get_weights())
    _assert_matches_torch(other._numpy_mlp, policy.model, rows)


def test_parameters_given_new_memory_are_seen() -> None:
    model, numpy_mlp, rows = _bound_model()
    _assert_matches_torch(numpy_mlp, model, rows)
    with torch.no_grad():
        model.logits.weight.data = torch.randn_like(model.logits.weight)
        model.value_trunk[0].bias = nn.Parameter(torch.ones(64))
    _assert_matches_torch(numpy_mlp, model, rows)


def test_replaced_layers_are_run_or_left_to_torch() -> None:
    model, numpy_mlp, rows = _bound_model()
    model.policy_trunk[1] = nn.ReLU()  # an activation numpy knows: used from now on
    _assert_matches_torch(numpy_mlp, model, rows)
    model.policy_trunk[3] = nn.GELU()  # one it does not know: torch runs the model
    assert numpy_mlp(rows) is None
    model.policy_trunk[3] = nn.Tanh()
    _assert_matches_torch(numpy_mlp, model, rows)


def test_hooks_and_other_dtypes_leave_the_forward_to_torch() -> None:
    model, numpy_mlp, rows = _bound_model()
    handle = model.value.register_forward_hook(lambda module, args, out: out * 2)
    assert numpy_mlp(rows) is None
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        assert numpy_mlp(rows) is None
    finally:
        handle.remove()
    _assert_matches_torch(numpy_mlp, model, rows)
    assert numpy_mlp(rows.astype(np.float64)) is None
    model.double()
    assert numpy_mlp(rows) is None


def test_a_policy_with_a_hooked_model_samples_through_the_hook() -> None:
    policy = TorchPolicy(OBS, ACTIONS, {"seed": 0})
    rows = {"obs": _rows(8)}
    plain = policy.compute_actions_from_input_dict(rows, explore=False)[2]["vf_preds"]
    policy.model.value.register_forward_hook(lambda module, args, out: out + 100.0)
    hooked = policy.compute_actions_from_input_dict(rows, explore=False)[2]["vf_preds"]
    np.testing.assert_allclose(hooked, plain + 100.0, rtol=1e-5)


def test_only_the_built_in_mlp_on_cpu_runs_in_numpy() -> None:
    class Subclass(MLPModel):
        pass

    assert NumpyMLP.for_model(Subclass(6, 4)) is None
    lstm = TorchPolicy(OBS, ACTIONS, {"model": {"type": "lstm"}})
    assert lstm._numpy_mlp is None


def test_unknown_cpu_inference_value_is_named() -> None:
    with pytest.raises(ValueError, match=r"'cpu_inference' must be one of \['numpy', 'torch'\], got 'jax'"):
        TorchPolicy(OBS, ACTIONS, {"cpu_inference": "jax"})


def test_a_patched_class_forward_leaves_the_forward_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, numpy_mlp, rows = _bound_model()
    _assert_matches_torch(numpy_mlp, model, rows)
    original = nn.Linear.forward
    monkeypatch.setattr(nn.Linear, "forward", lambda self, x: original(self, x) * 2)
    assert numpy_mlp(rows) is None
    monkeypatch.undo()
    _assert_matches_torch(numpy_mlp, model, rows)
    model.value._call_impl = lambda *args, **kwargs: torch.zeros(len(rows), 1)
    assert numpy_mlp(rows) is None


def test_a_pickled_policy_binds_again_where_it_is_unpickled() -> None:
    policy = TorchPolicy(OBS, ACTIONS, {"seed": 2})
    rows = {"obs": _rows(32)}
    before = policy.compute_actions_from_input_dict(rows, explore=False)[2]
    copy = pickle.loads(pickle.dumps(policy))
    assert copy._numpy_mlp._signature == () and copy._numpy_mlp._policy is None
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.mul_(0.5)  # in place: the unpickled views must be these tensors'
    after = copy.compute_actions_from_input_dict(rows, explore=False)[2]
    _assert_matches_torch(copy._numpy_mlp, copy.model, rows["obs"])
    assert not np.allclose(after["vf_preds"], before["vf_preds"])
