"""RandomPolicy sampling and build_policy from a config entry."""

from __future__ import annotations

import sys
import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_runner.policy import Policy, RandomPolicy, TorchPolicy, build_policy

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(4, start=2),
        gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
        gym.spaces.MultiBinary(3),
        gym.spaces.Box(-1.0, 2.0, (2,), np.float32),
        gym.spaces.Box(
            np.array([-np.inf, 0.0, -np.inf], np.float32),
            np.array([np.inf, np.inf, 1.0], np.float32),
        ),
        gym.spaces.Box(0, 5, (2,), np.int64),
    ],
    ids=str,
)
def test_random_actions_lie_in_the_space(space: gym.Space) -> None:
    policy = RandomPolicy(OBS_SPACE, space, {"seed": 0})
    actions, states, extra = policy.compute_actions_from_input_dict({"obs": np.zeros((200, 4))})
    assert actions.shape == (200, *space.shape) and actions.dtype == space.dtype
    assert all(space.contains(a) for a in actions)
    assert states == [] and extra == {}


def test_random_policy_seeding_and_state() -> None:
    space = gym.spaces.Discrete(10)
    rows = {"obs": np.zeros((50, 4))}
    first = RandomPolicy(OBS_SPACE, space, {"seed": 3})
    state = first.get_state()
    a = first.compute_actions_from_input_dict(rows)[0]
    assert np.array_equal(
        a, RandomPolicy(OBS_SPACE, space, {"seed": 3}).compute_actions_from_input_dict(rows)[0]
    )
    other = RandomPolicy(OBS_SPACE, space, {"seed": 4})
    assert not np.array_equal(a, other.compute_actions_from_input_dict(rows)[0])
    other.set_state(state)
    assert np.array_equal(a, other.compute_actions_from_input_dict(rows)[0])
    assert first.get_weights() == {}
    with pytest.raises(ValueError, match="has no weights"):
        first.set_weights({"w": np.zeros(1)})


class _TinyModel(torch.nn.Module):
    def __init__(self, obs_dim: int, num_outputs: int, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.net = torch.nn.Linear(obs_dim, num_outputs + 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(obs) * self.scale
        return out[:, :-1], out[:, -1]


class _ConstantPolicy(Policy):
    def compute_actions_from_input_dict(
        self, input_dict, explore=None, timestep=None, episodes=None
    ):
        return np.zeros(len(input_dict["obs"]), np.int64), [], {}


@pytest.fixture
def user_module(monkeypatch: pytest.MonkeyPatch) -> str:
    module = types.ModuleType("user_policy_code")
    module.TinyModel = _TinyModel
    module.ConstantPolicy = _ConstantPolicy
    module.NotAPolicy = dict
    monkeypatch.setitem(sys.modules, "user_policy_code", module)
    return "user_policy_code"


def test_build_default_torch_policy() -> None:
    policy = build_policy(
        "archer",
        {"model": {"type": "mlp", "hidden": [8]}, "config": {"gae": {}}},
        OBS_SPACE,
        gym.spaces.Discrete(3),
        seed=5,
    )
    assert isinstance(policy, TorchPolicy)
    assert policy.config["seed"] == 5 and policy.config["gae"] == {}
    assert policy.model.policy_trunk[0].out_features == 8


def test_build_ignores_runner_keys_and_uses_the_seed() -> None:
    spec = {
        "model": {"type": "mlp"},
        "agent_connectors": None,
        "action_connectors": None,
        "observation_space": None,
        "action_space": None,
        "policy_class": None,
        "config": {},
    }
    a = build_policy("p", spec, OBS_SPACE, gym.spaces.Discrete(3), seed=1)
    b = build_policy("p", spec, OBS_SPACE, gym.spaces.Discrete(3), seed=1)
    for name, weights in a.get_weights().items():
        np.testing.assert_array_equal(weights, b.get_weights()[name])


def test_build_user_model_and_policy_classes(user_module: str) -> None:
    policy = build_policy(
        "p",
        {"model": {"class": f"{user_module}:TinyModel", "scale": 2.0}},
        OBS_SPACE,
        gym.spaces.Discrete(3),
        seed=0,
    )
    assert isinstance(policy.model, _TinyModel) and policy.model.scale == 2.0
    custom = build_policy(
        "p",
        {"policy_class": f"{user_module}:ConstantPolicy"},
        OBS_SPACE,
        gym.spaces.Discrete(3),
        seed=0,
    )
    assert isinstance(custom, _ConstantPolicy)
    random_policy = build_policy(
        "p",
        {"policy_class": "RandomPolicy", "config": {"view_requirements": {"prev_rewards": {}}}},
        OBS_SPACE,
        gym.spaces.Discrete(3),
        seed=0,
    )
    assert isinstance(random_policy, RandomPolicy)
    assert random_policy.view_requirements == {"prev_rewards": {}}
    with pytest.raises(ValueError, match="'p'.*not a Policy subclass"):
        build_policy(
            "p",
            {"policy_class": f"{user_module}:NotAPolicy"},
            OBS_SPACE,
            gym.spaces.Discrete(3),
            seed=0,
        )


def test_unknown_model_type_names_policy_value_and_choices() -> None:
    with pytest.raises(ValueError) as info:
        build_policy(
            "knight", {"model": {"type": "transformer"}}, OBS_SPACE, gym.spaces.Discrete(3), 0
        )
    message = str(info.value)
    for part in ("'knight'", "'transformer'", "'mlp'", "'lstm'", "class"):
        assert part in message


def test_bad_obs_space_names_the_policy() -> None:
    with pytest.raises(ValueError, match="policy 'archer'.*flat Box"):
        build_policy("archer", {}, gym.spaces.Discrete(4), gym.spaces.Discrete(3), 0)
