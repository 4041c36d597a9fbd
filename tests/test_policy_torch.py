"""TorchPolicy: output shapes and dtypes, seeding, recurrent state, weights, errors."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_runner.policy import TorchPolicy
from marl_runner.policy.action_spaces import encode_actions
from marl_runner.policy.torch_utils import packed_to_numpy

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(5, start=1),
    "multidiscrete": gym.spaces.MultiDiscrete([3, 4, 2]),
    "multidiscrete2d": gym.spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, 0], [0, 5]]),
    "box": gym.spaces.Box(-2.0, 2.0, (2, 3), np.float32),
}
# Columns of action_dist_inputs per action space: logits, or [mean, log_std].
DIST_WIDTH = {"discrete": 5, "multidiscrete": 9, "multidiscrete2d": 11, "box": 12}
LSTM = {"type": "lstm", "hidden": [16], "lstm_cell_size": 8}


def _obs(num_rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (num_rows, 6)).astype(np.float32)


def _input(policy: TorchPolicy, obs: np.ndarray) -> dict[str, np.ndarray]:
    """obs plus initial recurrent state for every row."""
    rows = {"obs": obs}
    for i, state in enumerate(policy.get_initial_state()):
        rows[f"state_in_{i}"] = np.repeat(state[None], len(obs), axis=0)
    return rows


@pytest.mark.parametrize("model", [{"type": "mlp"}, LSTM], ids=["mlp", "lstm"])
@pytest.mark.parametrize("kind", sorted(ACTION_SPACES))
@pytest.mark.parametrize("explore", [True, False])
def test_output_shapes_and_dtypes(kind: str, model: dict, explore: bool) -> None:
    space = ACTION_SPACES[kind]
    policy = TorchPolicy(OBS_SPACE, space, {"model": model, "seed": 0})
    actions, state_outs, extra = policy.compute_actions_from_input_dict(
        _input(policy, _obs(7)), explore=explore
    )

    assert actions.shape == (7, *space.shape)
    assert actions.dtype == space.dtype
    assert all(space.contains(a) for a in actions) or kind == "box"  # Box actions are unclipped
    assert set(extra) == {"action_logp", "action_dist_inputs", "vf_preds"}
    assert extra["action_logp"].shape == (7,)
    assert extra["action_dist_inputs"].shape == (7, DIST_WIDTH[kind])
    assert extra["vf_preds"].shape == (7,)
    assert all(v.dtype == np.float32 for v in extra.values())
    assert len(state_outs) == policy.num_state_tensors()
    assert all(s.shape == (7, 8) and s.dtype == np.float32 for s in state_outs)


def test_discrete_start_offset_is_applied() -> None:
    policy = TorchPolicy(OBS_SPACE, gym.spaces.Discrete(3, start=10), {"seed": 0})
    actions, _, _ = policy.compute_actions_from_input_dict({"obs": _obs(500)})
    assert set(np.unique(actions)) <= {10, 11, 12}


def test_logp_matches_torch_distributions() -> None:
    """Hand-written log-probs agree with torch.distributions for every action space."""
    for kind, space in ACTION_SPACES.items():
        policy = TorchPolicy(OBS_SPACE, space, {"seed": 1})
        actions, _, extra = policy.compute_actions_from_input_dict({"obs": _obs(50)})
        inputs = torch.from_numpy(extra["action_dist_inputs"])
        if kind == "discrete":
            expected = torch.distributions.Categorical(logits=inputs).log_prob(
                torch.from_numpy(actions) - space.start
            )
        elif kind.startswith("multidiscrete"):
            parts = torch.split(inputs, space.nvec.reshape(-1).tolist(), dim=1)
            flat_actions = torch.from_numpy(actions.reshape(50, -1) - space.start.reshape(-1))
            expected = sum(
                torch.distributions.Categorical(logits=p).log_prob(flat_actions[:, i])
                for i, p in enumerate(parts)
            )
        else:
            mean, log_std = inputs.chunk(2, dim=1)
            normal = torch.distributions.Normal(mean, log_std.exp())
            expected = normal.log_prob(torch.from_numpy(actions.reshape(50, -1))).sum(1)
        np.testing.assert_allclose(extra["action_logp"], expected.numpy(), rtol=1e-5, atol=1e-5)


def test_box_without_exploration_returns_the_mean() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["box"], {"seed": 0})
    actions, _, extra = policy.compute_actions_from_input_dict({"obs": _obs(4)}, explore=False)
    np.testing.assert_array_equal(actions.reshape(4, -1), extra["action_dist_inputs"][:, :6])
    np.testing.assert_array_equal(extra["action_dist_inputs"][:, 6:], 0.0)  # log_std starts at 0


def test_config_explore_false_is_deterministic() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"seed": 0, "explore": False})
    first, _, _ = policy.compute_actions_from_input_dict({"obs": _obs(64)})
    second, _, _ = policy.compute_actions_from_input_dict({"obs": _obs(64)})
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("kind", sorted(ACTION_SPACES))
def test_same_seed_same_actions_whatever_the_global_rng_does(kind: str) -> None:
    space = ACTION_SPACES[kind]
    first = TorchPolicy(OBS_SPACE, space, {"seed": 7})
    torch.rand(1000)  # global RNG use between constructions and calls must not matter
    second = TorchPolicy(OBS_SPACE, space, {"seed": 7})
    for step in range(3):
        torch.randn(17)
        a, _, extra_a = first.compute_actions_from_input_dict({"obs": _obs(32, step)})
        b, _, extra_b = second.compute_actions_from_input_dict({"obs": _obs(32, step)})
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(extra_a["vf_preds"], extra_b["vf_preds"])
    other = TorchPolicy(OBS_SPACE, space, {"seed": 8})
    c, _, _ = other.compute_actions_from_input_dict({"obs": _obs(32, 2)})
    assert not np.array_equal(a, c)


def test_seeding_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"seed": 5})
    np.testing.assert_array_equal(torch.rand(3), expected)


def test_lstm_initial_state_shapes() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"model": LSTM})
    states = policy.get_initial_state()
    assert policy.is_recurrent() and policy.num_state_tensors() == 2
    assert [s.shape for s in states] == [(8,), (8,)]
    assert all(s.dtype == np.float32 and not s.any() for s in states)
    feed_forward = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {})
    assert feed_forward.get_initial_state() == [] and not feed_forward.is_recurrent()


def test_lstm_rows_keep_their_own_state() -> None:
    """Agents batched together each step their own state, exactly as if run alone."""
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"model": LSTM, "seed": 0})
    obs = np.repeat(_obs(1), 3, axis=0)  # same observation for every agent
    rng = np.random.default_rng(1)
    h = rng.normal(size=(3, 8)).astype(np.float32)
    c = rng.normal(size=(3, 8)).astype(np.float32)
    h[0], c[0] = 0.0, 0.0
    batch_in = {"obs": obs, "state_in_0": h, "state_in_1": c}
    _, (h_out, c_out), extra = policy.compute_actions_from_input_dict(batch_in, explore=False)

    logits = extra["action_dist_inputs"]
    assert not np.allclose(logits[0], logits[1]) and not np.allclose(logits[1], logits[2])
    assert not np.allclose(h_out, h) and not np.allclose(c_out, c)  # state advanced
    for row in range(3):
        alone = {k: v[row : row + 1] for k, v in batch_in.items()}
        _, (h_row, c_row), extra_row = policy.compute_actions_from_input_dict(alone, explore=False)
        np.testing.assert_allclose(h_row[0], h_out[row], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c_row[0], c_out[row], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(extra_row["action_dist_inputs"][0], logits[row], atol=1e-5)

    # Feeding the state back changes the output for the same observation.
    _, _, extra_next = policy.compute_actions_from_input_dict(
        {"obs": obs, "state_in_0": h_out, "state_in_1": c_out}, explore=False
    )
    assert not np.allclose(extra_next["action_dist_inputs"], logits)


def test_prev_actions_and_rewards_feed_the_model() -> None:
    view = {"prev_actions": {"data_col": "actions", "shift": -1}, "prev_rewards": {}}
    space = ACTION_SPACES["multidiscrete"]
    policy = TorchPolicy(OBS_SPACE, space, {"seed": 0, "view_requirements": view})
    assert policy.view_requirements == view
    obs = np.repeat(_obs(1), 2, axis=0)
    rows = {
        "obs": obs,
        "prev_actions": np.array([[0, 0, 0], [2, 3, 1]]),
        "prev_rewards": np.array([0.0, 1.0], np.float32),
    }
    _, _, extra = policy.compute_actions_from_input_dict(rows, explore=False)
    assert not np.allclose(extra["vf_preds"][0], extra["vf_preds"][1])
    with pytest.raises(ValueError, match="prev_rewards"):
        policy.compute_actions_from_input_dict({k: rows[k] for k in ("obs", "prev_actions")})


def test_encode_actions_one_hot_and_out_of_space_zero_fill() -> None:
    discrete = gym.spaces.Discrete(3, start=1)
    np.testing.assert_array_equal(
        encode_actions(np.array([1, 3, 0]), discrete),  # 0: zero fill before the first action
        [[1, 0, 0], [0, 0, 1], [0, 0, 0]],
    )
    multi = gym.spaces.MultiDiscrete([2, 3])
    np.testing.assert_array_equal(
        encode_actions(np.array([[1, 2], [0, 0]]), multi), [[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]]
    )
    box = gym.spaces.Box(-1, 1, (2, 2), np.float32)
    assert encode_actions(np.ones((3, 2, 2)), box).shape == (3, 4)


def test_weights_round_trip() -> None:
    for kind, space in ACTION_SPACES.items():
        source = TorchPolicy(OBS_SPACE, space, {"seed": 1})
        target = TorchPolicy(OBS_SPACE, space, {"seed": 2})
        weights = source.get_weights()
        assert all(isinstance(w, np.ndarray) for w in weights.values())
        assert ("action_head.log_std" in weights) == (kind == "box")
        target.set_weights(weights)
        obs = {"obs": _obs(16)}
        _, _, a = source.compute_actions_from_input_dict(obs, explore=False)
        _, _, b = target.compute_actions_from_input_dict(obs, explore=False)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])

    # get_weights hands out copies: changing them does not change the policy.
    name = next(iter(weights))
    weights[name] += 1.0
    assert not np.array_equal(source.get_weights()[name], weights[name])


def test_state_round_trip_restores_sampling() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"seed": 3})
    state = policy.get_state()
    first, _, _ = policy.compute_actions_from_input_dict({"obs": _obs(64)})
    clone = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"seed": 4})
    clone.set_state(state)
    second, _, _ = clone.compute_actions_from_input_dict({"obs": _obs(64)})
    np.testing.assert_array_equal(first, second)


def test_user_model_class() -> None:
    class TwoHeads(torch.nn.Module):
        def __init__(self, obs_dim: int, num_outputs: int, width: int = 4) -> None:
            super().__init__()
            self.body = torch.nn.Linear(obs_dim, width)
            self.logits = torch.nn.Linear(width, num_outputs)
            self.value = torch.nn.Linear(width, 1)

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            features = self.body(obs)
            return self.logits(features), self.value(features)  # value [n, 1] is fine

    policy = TorchPolicy(
        OBS_SPACE, ACTION_SPACES["discrete"], {"model": {"class": TwoHeads, "width": 3}}
    )
    assert policy.model.body.out_features == 3
    actions, _, extra = policy.compute_actions_from_input_dict({"obs": _obs(5)})
    assert actions.shape == (5,) and extra["vf_preds"].shape == (5,)


def test_empty_input_gives_empty_outputs() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {})
    actions, _, extra = policy.compute_actions_from_input_dict(
        {"obs": np.zeros((0, 6), np.float32)}
    )
    assert actions.shape == (0,) and extra["action_dist_inputs"].shape == (0, 5)


def test_packed_host_copy_restores_shapes_and_dtypes() -> None:
    """The accelerator path packs outputs into one block; check it on CPU tensors."""
    tensors = [
        torch.tensor([[1, 2], [3, 4]]),
        torch.tensor([0.5, -1.5]),
        torch.arange(12, dtype=torch.float32).reshape(2, 2, 3),
    ]
    out = packed_to_numpy(tensors)
    for array, tensor in zip(out, tensors):
        assert array.shape == tuple(tensor.shape)
        np.testing.assert_array_equal(array, tensor.numpy())
    assert [a.dtype for a in out] == [np.int64, np.float32, np.float32]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_shapes() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["multidiscrete"], {"device": "cuda", "seed": 0})
    mask = np.ones((9, 9), np.int8)
    mask[:, 0] = 0
    actions, _, extra = policy.compute_actions_from_input_dict(
        {"obs": _obs(9), "action_mask": mask}
    )
    assert actions.dtype == np.int64 and actions.shape == (9, 3) and (actions[:, 0] != 0).all()
    assert extra["action_dist_inputs"].shape == (9, 9)


def test_device_choices() -> None:
    auto = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"device": "auto"})
    assert auto.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="'tpu9'"):
        TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"device": "tpu9"})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"device": "cuda"})


def test_non_box_observation_space_is_rejected() -> None:
    dict_space = gym.spaces.Dict(
        {"observation": OBS_SPACE, "action_mask": gym.spaces.MultiBinary(5)}
    )
    with pytest.raises(ValueError, match="flat Box.*ObsPreprocessorConnector"):
        TorchPolicy(dict_space, ACTION_SPACES["discrete"], {})


def test_unsupported_action_space_is_rejected() -> None:
    tuple_space = gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(3)])
    with pytest.raises(ValueError, match="Discrete, MultiDiscrete and Box"):
        TorchPolicy(OBS_SPACE, tuple_space, {})


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="'gea'"):
        TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"gea": {}})
    with pytest.raises(ValueError, match="'hiden'"):
        TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"model": {"type": "mlp", "hiden": [8]}})
    with pytest.raises(ValueError, match="'sigmoid'.*relu"):
        TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"model": {"activation": "sigmoid"}})


def test_input_errors() -> None:
    policy = TorchPolicy(OBS_SPACE, ACTION_SPACES["discrete"], {"model": LSTM})
    with pytest.raises(ValueError, match="'state_in_0'.*StateBufferConnector"):
        policy.compute_actions_from_input_dict({"obs": _obs(2)})
    with pytest.raises(ValueError, match=r"obs rows have shape \(4,\)"):
        policy.compute_actions_from_input_dict(_input(policy, np.zeros((2, 4), np.float32)))
