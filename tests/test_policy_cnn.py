"""The built-in cnn model: image input (uint8, channels last), config checks, TorchPolicy use."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_runner import RunnerConfig, TorchPolicy
from marl_runner.config import ConfigError
from marl_runner.policy.builder import build_policy
from marl_runner.policy.models import CNNModel, build_model

IMAGE = gym.spaces.Box(0, 255, (20, 16, 2), np.uint8)
SMALL_CNN = {"type": "cnn", "conv": [[4, 4, 2], [8, 3, 2]], "hidden": [16]}
ACTIONS = gym.spaces.Discrete(3)


def frames(n: int, space: gym.Space = IMAGE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *space.shape), dtype=np.uint8)


def cnn_policy(space: gym.Space = IMAGE, **model) -> TorchPolicy:
    return TorchPolicy(space, ACTIONS, {"model": {**SMALL_CNN, **model}, "seed": 3})


# --------------------------------------------------------------------------- the model


def test_nature_defaults_on_84x84_frames():
    model = build_model({"type": "cnn"}, 84 * 84 * 4, 6, obs_shape=(84, 84, 4))
    convs = [m for m in model.policy_trunk.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == [
        (4, 32, 8, 4),
        (32, 64, 4, 2),
        (64, 64, 3, 1),
    ]
    dense = [m for m in model.policy_trunk.modules() if isinstance(m, torch.nn.Linear)]
    assert [(d.in_features, d.out_features) for d in dense] == [(64 * 7 * 7, 512)]
    assert model.value_trunk is not None  # separate policy and value trunks, as for mlp
    logits, value = model(torch.from_numpy(frames(2, gym.spaces.Box(0, 255, (84, 84, 4)))))
    assert logits.shape == (2, 6) and value.shape == (2,)


def test_uint8_pixels_are_scaled_inside_the_model():
    model = CNNModel((20, 16, 2), 3, conv=[[4, 4, 2]], hidden=[8])
    pixels = torch.from_numpy(frames(3))
    scaled = pixels.float() / 255.0
    for got, want in zip(model(pixels), model(scaled)):
        torch.testing.assert_close(got, want)


def test_channels_are_the_last_axis():
    torch.manual_seed(0)  # some draws leave every unit the pixel reaches dead (ReLU): no change
    model = CNNModel((20, 16, 2), 3, conv=[[4, 4, 2]], hidden=[8])
    assert model.policy_trunk[0].in_channels == 2
    # A change in one pixel's channel moves the output; the model reads HWC, not CHW.
    pixels = torch.zeros(1, 20, 16, 2)
    before = model(pixels)[0]
    pixels[0, 10, 8, 1] = 1.0
    assert not torch.equal(model(pixels)[0], before)
    with pytest.raises(RuntimeError):
        model(torch.zeros(1, 2, 20, 16))  # channels first is not what it takes


def test_a_conv_stack_that_shrinks_the_image_away_is_named():
    with pytest.raises(ValueError, match=r"conv layer 1 \[8, 8, 1\].*10x10 image"):
        CNNModel((10, 10, 1), 3, conv=[[4, 4, 2], [8, 8, 1]])


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"type": "cnn", "kernels": [3]}, r"unknown key\(s\) \['kernels'\] in cnn model config"),
        ({"type": "cnn", "conv": [[32, 8]]}, "conv must be a non-empty list of"),
        ({"type": "cnn", "conv": []}, "conv must be a non-empty list of"),
        ({"type": "cnn", "activation": "gelu"}, "unknown model activation 'gelu'"),
        ({"type": "cnnn"}, "expected 'mlp', 'lstm', 'cnn'"),
    ],
)
def test_build_model_names_bad_keys(model, words):
    with pytest.raises(ValueError, match=words):
        build_model(model, 20 * 16 * 2, 3, obs_shape=(20, 16, 2))


def test_build_model_cnn_needs_an_image_shape():
    with pytest.raises(ValueError, match=r"needs image observations.*got shape \(12,\)"):
        build_model({"type": "cnn"}, 12, 3, obs_shape=(12,))


# --------------------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    ("model", "key", "words"),
    [
        ({"type": "cnn", "kernel": 3}, "policies.p.model.kernel", "unknown key for a cnn model"),
        ({"type": "cnn", "conv": [[32, 8, 0]]}, "policies.p.model.conv", "[out_channels, kernel"),
        ({"type": "cnn", "conv": "nature"}, "policies.p.model.conv", "integer triples"),
        ({"type": "cnn", "hidden": [0]}, "policies.p.model.hidden", "layer sizes >= 1"),
        ({"type": "mlp", "conv": [[8, 3, 1]]}, "policies.p.model.conv", "unknown key for a mlp"),
    ],
)
def test_config_names_bad_cnn_keys(model, key, words):
    data = {"env": "pettingzoo.butterfly.pistonball_v6:parallel_env", "policies": {"p": {}}}
    data["policies"]["p"]["model"] = model
    with pytest.raises(ConfigError) as err:
        RunnerConfig.from_dict(data)
    assert err.value.key == key and words in str(err.value)


def test_cnn_on_a_flat_observation_space_is_a_build_error_naming_policy_and_space():
    flat = gym.spaces.Box(-1.0, 1.0, (12,), np.float32)
    with pytest.raises(ValueError, match=r"policy 'pilot': model type 'cnn' needs image") as err:
        build_policy("pilot", {"model": SMALL_CNN}, flat, ACTIONS, seed=0)
    assert "Box(-1.0, 1.0, (12,), float32)" in str(err.value)


def test_cnn_takes_no_previous_actions_or_rewards():
    config = {"model": SMALL_CNN, "view_requirements": {"prev_actions": {}}}
    with pytest.raises(ValueError, match="drop prev_actions/prev_rewards"):
        TorchPolicy(IMAGE, ACTIONS, config)


# --------------------------------------------------------------------------- TorchPolicy


def test_actions_values_and_evaluate_on_uint8_frames():
    policy = cnn_policy()
    obs = frames(7)
    actions, states, extra = policy.compute_actions_from_input_dict({"obs": obs})
    assert actions.shape == (7,) and states == []
    assert set(np.unique(actions)) <= {0, 1, 2}
    batch = {"obs": obs, "actions": actions}
    logp, entropy, values = policy.evaluate(batch)
    np.testing.assert_allclose(logp.detach().numpy(), extra["action_logp"], atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), extra["vf_preds"], atol=1e-5)
    # Gradients reach the first convolution: the whole model trains through evaluate.
    (-logp.mean() + values.square().mean() - 0.01 * entropy.mean()).backward()
    first_conv = policy.model.policy_trunk[0]
    assert first_conv.weight.grad is not None and first_conv.weight.grad.abs().sum() > 0


def test_shared_trunk_and_weights_round_trip():
    policy = cnn_policy(vf_share_layers=True)
    assert policy.model.value_trunk is None
    other = cnn_policy(vf_share_layers=True)
    other.set_weights({k: v + 0.5 for k, v in policy.get_weights().items()})
    obs = frames(4)
    assert not np.allclose(
        policy.compute_actions_from_input_dict({"obs": obs}, explore=False)[2]["vf_preds"],
        other.compute_actions_from_input_dict({"obs": obs}, explore=False)[2]["vf_preds"],
    )
    other.set_weights(policy.get_weights())
    np.testing.assert_array_equal(
        policy.compute_actions_from_input_dict({"obs": obs}, explore=False)[2]["vf_preds"],
        other.compute_actions_from_input_dict({"obs": obs}, explore=False)[2]["vf_preds"],
    )


def test_wrong_frame_shape_is_named():
    with pytest.raises(ValueError, match=r"obs rows have shape \(16, 20, 2\)"):
        cnn_policy().compute_actions_from_input_dict({"obs": np.zeros((2, 16, 20, 2), np.uint8)})


def test_mlp_on_image_frames_flattens_them_as_before():
    policy = TorchPolicy(IMAGE, ACTIONS, {"model": {"type": "mlp", "hidden": [8]}, "seed": 1})
    obs = frames(3)
    _, _, extra = policy.compute_actions_from_input_dict({"obs": obs}, explore=False)
    as_floats = obs.reshape(3, -1).astype(np.float32)
    logits, values = policy.model(torch.from_numpy(as_floats))
    np.testing.assert_allclose(extra["vf_preds"], values.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cnn_on_cuda_matches_cpu():
    cpu = cnn_policy()
    gpu = TorchPolicy(IMAGE, ACTIONS, {"model": SMALL_CNN, "seed": 3, "device": "cuda"})
    gpu.set_weights(cpu.get_weights())
    obs = frames(5)
    batch = {"obs": obs, "actions": np.array([0, 1, 2, 1, 0])}
    for got, want in zip(gpu.evaluate(batch), cpu.evaluate(batch)):
        np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), atol=1e-4)
