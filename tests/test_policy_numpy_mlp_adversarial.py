"""Adversarial checks of the numpy sampling forward pass (cpu_inference: numpy).

The promise under test: a TorchPolicy's sampling outputs equal what its torch
module gives (to float32 rounding), whatever was done to the model or its
weights after the policy was built, and never silently differ. The changes in
BROKEN and the non-finite obs broke it when first tried (each names how); the
rest held from the start.
tests/test_policy_numpy_mlp.py has the basic equality checks.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.utils.prune as prune
from threadpoolctl import threadpool_info, threadpool_limits
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.policy import TorchPolicy

OBS = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
ACTIONS = gym.spaces.Discrete(4)
FLOATS = ("action_logp", "action_dist_inputs", "vf_preds")


def _rows(n: int = 32, width: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, width)).astype(np.float32)


def _sampled_policy(config: dict | None = None) -> TorchPolicy:
    """A numpy-path policy that has sampled once, so its weight views are bound."""
    policy = TorchPolicy(OBS, ACTIONS, {"seed": 0, **(config or {})})
    policy.compute_actions_from_input_dict({"obs": _rows(4)})
    assert policy._numpy_mlp is not None and policy._numpy_mlp._policy is not None
    return policy


def _assert_samples_like_its_torch_module(policy: TorchPolicy, rows: np.ndarray) -> None:
    """Greedy sampling's logits and values equal the torch module's on the same rows."""
    _, _, extra = policy.compute_actions_from_input_dict({"obs": rows}, explore=False)
    with torch.inference_mode():
        logits, values = policy.model(torch.from_numpy(rows))
    np.testing.assert_allclose(extra["action_dist_inputs"], logits.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(extra["vf_preds"], values.numpy(), rtol=1e-5, atol=1e-5)


# --- changes to the model or its weights after the views were bound: what held ---------------


def _set_state_of_a_trained_copy(policy: TorchPolicy) -> None:
    other = TorchPolicy(OBS, ACTIONS, {"seed": 7})
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(1.5)
    policy.set_state(other.get_state())


def _load_non_contiguous_with_assign(policy: TorchPolicy) -> None:
    state = {
        name: (value.t().contiguous().t() if value.ndim == 2 else value) * 2
        for name, value in policy.model.state_dict().items()
    }
    policy.model.load_state_dict(state, assign=True)
    assert not policy.model.policy_trunk[0].weight.is_contiguous()


def _round_trip_dtype(policy: TorchPolicy) -> None:
    policy.network.double()
    policy.network.half()
    policy.network.float()


def _copy_into_parameters(policy: TorchPolicy) -> None:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def _share_trunk_weights(policy: TorchPolicy) -> None:
    policy.model.value_trunk[0].weight = policy.model.policy_trunk[0].weight
    policy.model.value_trunk[2] = policy.model.policy_trunk[2]


def _parametrize_then_remove(policy: TorchPolicy) -> None:
    layer = policy.model.policy_trunk[2]
    parametrizations.orthogonal(layer)
    parametrize.remove_parametrizations(layer, "weight", leave_parametrized=True)
    assert type(layer) is nn.Linear


def _prune_then_remove(policy: TorchPolicy) -> None:
    prune.l1_unstructured(policy.model.policy_trunk[0], "weight", 0.5)
    prune.remove(policy.model.policy_trunk[0], "weight")


class _Doubled(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2


HELD: dict[str, Callable[[TorchPolicy], Any]] = {
    "set_state of another policy": _set_state_of_a_trained_copy,
    "load_state_dict assign=True, non-contiguous": _load_non_contiguous_with_assign,
    "double, half, back to float": _round_trip_dtype,
    "copy_ into every parameter": _copy_into_parameters,
    "requires_grad_(False)": lambda p: p.network.requires_grad_(False),
    "share_memory (storage moved in place)": lambda p: p.model.share_memory(),
    "train mode": lambda p: p.network.train(),
    "weights shared between trunks": _share_trunk_weights,
    "parametrized trunk layer (declined)": lambda p: parametrize.register_parametrization(
        p.model.policy_trunk[0], "weight", _Doubled()
    ),
    "parametrization removed": _parametrize_then_remove,
    "pruned trunk layer (hook: declined)": lambda p: prune.l1_unstructured(
        p.model.value_trunk[2], "weight", 0.5
    ),
    "pruning made permanent": _prune_then_remove,
    "spectral_norm hook (declined)": lambda p: nn.utils.spectral_norm(p.model.policy_trunk[0]),
    "activation replaced by Identity (declined)": lambda p: p.model.value_trunk.__setitem__(
        1, nn.Identity()
    ),
}


def test_dropout_added_in_train_mode_is_left_to_torch() -> None:
    policy = _sampled_policy()
    policy.model.policy_trunk.append(nn.Dropout(0.5))
    policy.network.train()
    assert policy._numpy_mlp(_rows()) is None  # random in train mode: only torch can run it


@pytest.mark.parametrize(
    "hook",
    [
        lambda m: m.register_forward_hook(lambda mod, args, out: out * 2, with_kwargs=False),
        lambda m: m.register_forward_hook(lambda mod, a, k, out: out * 2, with_kwargs=True),
        lambda m: m.register_forward_hook(lambda mod, args, out: out * 2, always_call=True),
        lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),
        lambda m: m.register_forward_pre_hook(
            lambda mod, args, kwargs: ((args[0] * 2,), kwargs), with_kwargs=True
        ),
    ],
    ids=["forward", "with_kwargs", "always_call", "pre", "pre_with_kwargs"],
)
def test_hooks_on_a_trunk_layer_are_run(hook: Callable[[nn.Module], Any]) -> None:
    policy = _sampled_policy()
    rows = _rows()
    handle = hook(policy.model.policy_trunk[2])
    try:
        _assert_samples_like_its_torch_module(policy, rows)
    finally:
        handle.remove()
    _assert_samples_like_its_torch_module(policy, rows)


def test_a_global_forward_hook_is_run() -> None:
    policy = _sampled_policy()
    handle = nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out * 2 if isinstance(mod, nn.Tanh) else None
    )
    try:
        _assert_samples_like_its_torch_module(policy, _rows())
    finally:
        handle.remove()


# --- changes that broke the promise when first tried (now fixed) --------------------------------


def _head_without_bias(policy: TorchPolicy) -> None:
    policy.model.logits = nn.Linear(64, 4, bias=False)


def _trunk_not_a_sequential(policy: TorchPolicy) -> None:
    policy.model.value_trunk = nn.Linear(6, 64)


class _ScaledSequential(nn.Sequential):
    """A trunk with its own forward: calling it is not running its layers in turn."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def _transpose_in_place(policy: TorchPolicy) -> None:
    with torch.no_grad():
        policy.model.policy_trunk[2].weight.t_()  # a square 64x64 layer: same memory, transposed


BROKEN = {
    # A head numpy cannot run raised _UnknownLayer out of _bind (outside its try).
    "spectral_norm parametrization on the value head": lambda p: parametrizations.spectral_norm(
        p.model.value
    ),
    "logits head without bias": _head_without_bias,
    # _trunk iterated a non-Sequential trunk (TypeError) or ran a Sequential subclass's
    # layers, ignoring its forward.
    "trunk replaced by a single Linear": _trunk_not_a_sequential,
    "trunk replaced by a Sequential subclass with its own forward": lambda p: setattr(
        p.model, "value_trunk", _ScaledSequential(*p.model.value_trunk)
    ),
    # The signature keyed parameters by data_ptr alone: same memory, new strides.
    "weight transposed in place": _transpose_in_place,
}


CHANGES = {**HELD, **BROKEN}


@pytest.mark.parametrize("change", list(CHANGES))
def test_sampling_follows_the_torch_module_after(change: str) -> None:
    policy = _sampled_policy()
    CHANGES[change](policy)
    _assert_samples_like_its_torch_module(policy, _rows())


def test_non_finite_obs_sample_without_warnings_as_with_torch() -> None:
    rows = _rows(8)
    rows[1] = np.inf
    rows[2] = -np.inf
    rows[3, 0] = np.nan
    outputs = {}
    for inference in ("torch", "numpy"):
        policy = TorchPolicy(OBS, ACTIONS, {"seed": 0, "cpu_inference": inference})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            outputs[inference] = policy.compute_actions_from_input_dict({"obs": rows})
    np.testing.assert_array_equal(outputs["numpy"][0], outputs["torch"][0])
    np.testing.assert_allclose(
        outputs["numpy"][2]["vf_preds"], outputs["torch"][2]["vf_preds"], rtol=1e-5
    )


# --- inputs and outputs -----------------------------------------------------------------------


def _input_variants() -> dict[str, np.ndarray]:
    base = np.random.default_rng(4).uniform(-3, 3, (40, 20))
    read_only = _rows(9, seed=2)
    read_only.flags.writeable = False
    return {
        "0 rows": np.zeros((0, 6), np.float32),
        "1 row": _rows(1),
        "5000 rows": _rows(5000),
        "non-contiguous": base.astype(np.float32)[::3, 5:11],
        "fortran order": np.asfortranarray(_rows(17)),
        "read-only": read_only,
        "float64": base[:, :6],
        "nan and inf": np.where(_rows(12) > 0.8, np.inf, np.where(_rows(12) < -0.8, np.nan, 1.0)),
    }


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")
@pytest.mark.parametrize("variant", list(_input_variants()))
@pytest.mark.parametrize("explore", [True, False])
def test_odd_inputs_sample_as_the_torch_path_and_are_not_written(
    variant: str, explore: bool
) -> None:
    obs = _input_variants()[variant]
    before = obs.copy()
    outputs = []
    for inference in ("numpy", "torch"):
        policy = TorchPolicy(OBS, ACTIONS, {"seed": 5, "cpu_inference": inference})
        with np.errstate(all="ignore"):
            outputs.append(policy.compute_actions_from_input_dict({"obs": obs}, explore=explore))
    (actions, _, extra), (expected_actions, _, expected) = outputs
    np.testing.assert_array_equal(actions, expected_actions)
    for column in FLOATS:
        assert extra[column].dtype == np.float32 and extra[column].shape == expected[column].shape
        np.testing.assert_allclose(extra[column], expected[column], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(obs, before)


@pytest.mark.parametrize(
    ("action_space", "model"),
    [
        (gym.spaces.Discrete(4), {"type": "mlp", "hidden": [], "vf_share_layers": True}),
        (gym.spaces.Discrete(4), {"type": "mlp", "hidden": [8], "activation": "relu"}),
        (gym.spaces.MultiDiscrete([3, 2]), {"type": "mlp"}),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), {"type": "mlp", "vf_share_layers": True}),
    ],
    ids=["no hidden, shared", "relu", "multidiscrete", "box"],
)
def test_outputs_do_not_alias_what_the_next_call_overwrites(
    action_space: gym.Space, model: dict
) -> None:
    policy = TorchPolicy(OBS, action_space, {"seed": 2, "model": model})
    obs = _rows(16)
    first_actions, _, first = policy.compute_actions_from_input_dict({"obs": obs})
    kept = {column: first[column].copy() for column in FLOATS}
    kept_actions = first_actions.copy()
    obs[:] = _rows(16, seed=3)  # the caller reuses its obs buffer, as a runner's block would
    for seed in range(4):
        policy.compute_actions_from_input_dict({"obs": _rows(16, seed=10 + seed)})
    np.testing.assert_array_equal(first_actions, kept_actions)
    for column in FLOATS:
        np.testing.assert_array_equal(first[column], kept[column])


@pytest.mark.parametrize(
    "action_space",
    [gym.spaces.MultiDiscrete([3, 2]), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)],
    ids=["multidiscrete", "box"],
)
def test_torch_heads_on_numpy_outputs_draw_as_the_torch_path(action_space: gym.Space) -> None:
    fast = TorchPolicy(OBS, action_space, {"seed": 3})
    slow = TorchPolicy(OBS, action_space, {"seed": 3, "cpu_inference": "torch"})
    rows = {"obs": _rows(50)}
    for _ in range(3):
        actions, _, extra = fast.compute_actions_from_input_dict(rows)
        expected_actions, _, expected = slow.compute_actions_from_input_dict(rows)
        np.testing.assert_allclose(actions, expected_actions, rtol=1e-5, atol=1e-6)
        for column in FLOATS:
            np.testing.assert_allclose(extra[column], expected[column], rtol=1e-5, atol=1e-6)
    logp, _, values = fast.evaluate({"obs": rows["obs"], "actions": actions})
    np.testing.assert_allclose(logp.detach().numpy(), extra["action_logp"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), extra["vf_preds"], rtol=1e-5, atol=1e-6)


class _CountingMLP:
    """Wraps a policy's NumpyMLP, counting the rows it ran and the calls it declined."""

    def __init__(self, numpy_mlp: Any) -> None:
        self.numpy_mlp = numpy_mlp
        self.rows: list[int] = []
        self.declined = 0

    def __call__(self, rows: np.ndarray) -> Any:
        outputs = self.numpy_mlp(rows)
        self.rows.append(len(rows))
        self.declined += outputs is None
        return outputs


def test_gae_bootstrap_runs_in_numpy_and_equals_torch() -> None:
    config = {
        "seed": 1,
        "gae": {"gamma": 0.9, "lambda": 0.8},
        "view_requirements": {"prev_actions": {}, "prev_rewards": {}},
    }
    fast = TorchPolicy(OBS, ACTIONS, config)
    slow = TorchPolicy(OBS, ACTIONS, {**config, "cpu_inference": "torch"})
    spy = fast._numpy_mlp = _CountingMLP(fast._numpy_mlp)
    obs = _rows(6).astype(np.float64)  # the batch's own dtype: the policy casts
    batch = {
        "obs": obs,
        "new_obs": np.roll(obs, -1, axis=0),
        "actions": np.arange(6) % 4,
        "rewards": np.linspace(-1.0, 1.0, 6),
        "terminateds": np.zeros(6, bool),
    }
    batch["vf_preds"] = slow.compute_actions_from_input_dict(
        {"obs": obs, "prev_actions": np.zeros(6, np.int64), "prev_rewards": np.zeros(6)}
    )[2]["vf_preds"]
    got = fast.postprocess_trajectory(copy.deepcopy(batch))
    expected = slow.postprocess_trajectory(copy.deepcopy(batch))
    assert spy.rows == [1] and spy.declined == 0
    for column in ("advantages", "value_targets"):
        np.testing.assert_allclose(got[column], expected[column], rtol=1e-5, atol=1e-6)


# --- full runners on real envs -----------------------------------------------------------------

_GAE = {"gae": {"gamma": 0.9, "lambda": 0.8}}
RUNNERS = {
    "cheap env": {
        "env": {
            "name": "marl_runner.bench.envs:CheapEnv",
            "config": {"num_agents": 3, "episode_len": 7},
        },
        "policies": {"shared": {"model": {"type": "mlp", "hidden": [16]}, "config": _GAE}},
    },
    "connect_four (masks, two policies)": {
        "env": {"name": "pettingzoo.classic.connect_four_v3:env", "api": "aec"},
        "policies": {
            "player_0": {"config": _GAE},
            "player_1": {"model": {"type": "mlp", "activation": "relu", "vf_share_layers": True}},
        },
        "policy_mapping_fn": "examples.mappings:by_seat",
    },
    "simple_spread (prev actions and rewards)": {
        "env": {
            "name": "mpe2.simple_spread_v3:parallel_env",
            "api": "parallel",
            "config": {"N": 3, "max_cycles": 10, "continuous_actions": False},
        },
        "policies": {
            "shared": {
                "config": {**_GAE, "view_requirements": {"prev_actions": {}, "prev_rewards": {}}}
            }
        },
    },
    "simple_spread continuous (Box head in torch)": {
        "env": {
            "name": "mpe2.simple_spread_v3:parallel_env",
            "api": "parallel",
            "config": {"N": 2, "max_cycles": 10, "continuous_actions": True},
        },
        "policies": {"shared": {"config": _GAE}},
    },
}


def _runner_config(name: str, inference: str) -> RunnerConfig:
    data = copy.deepcopy(RUNNERS[name])
    for spec in data["policies"].values():
        spec["config"] = {**spec.get("config", {}), "cpu_inference": inference}
    return RunnerConfig.from_dict({"num_envs": 2, "rollout_fragment_length": 25, "seed": 3, **data})


def _sample(name: str, inference: str, rounds: int) -> tuple[list[Any], Any]:
    with EnvRunner(_runner_config(name, inference)) as runner:
        return [runner.sample() for _ in range(rounds)], runner.policy_map


@pytest.mark.parametrize("name", list(RUNNERS))
def test_runner_batches_equal_with_numpy_and_torch_inference(name: str) -> None:
    batches, policies = _sample(name, "numpy", 3)
    expected_batches, _ = _sample(name, "torch", 3)
    for batch, expected in zip(batches, expected_batches):
        assert batch.policy_batches.keys() == expected.policy_batches.keys()
        for policy_id, rows in batch.policy_batches.items():
            other = expected.policy_batches[policy_id]
            assert len(rows) > 0 and rows.keys() == other.keys()
            assert "advantages" in rows or policy_id == "player_1"
            for column in rows.keys() - {"eps_id", "unroll_id", "infos"}:
                got, want = np.asarray(rows[column]), np.asarray(other[column])
                if got.dtype.kind == "f":
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=column)
                else:
                    np.testing.assert_array_equal(got, want, err_msg=column)
    for policy_id in batches[0].policy_batches:
        numpy_mlp = policies[policy_id]._numpy_mlp
        assert numpy_mlp is not None and numpy_mlp._policy is not None  # it did run in numpy
    # The first round's columns, kept through later rounds, still are what torch gives.
    for policy_id, rows in batches[0].policy_batches.items():
        policy = policies[policy_id]
        logp, _, values = policy.evaluate(rows)
        np.testing.assert_allclose(logp.detach().numpy(), rows["action_logp"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(values.detach().numpy(), rows["vf_preds"], rtol=1e-5, atol=1e-5)


# --- BLAS threads -----------------------------------------------------------------------------


def _blas_threads() -> set[int]:
    return {info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}


@pytest.mark.parametrize(("torch_threads", "expected"), [(1, 1), (None, 2)])
def test_torch_threads_limits_blas_threads_or_leaves_them(
    torch_threads: int | None, expected: int
) -> None:
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "marl_runner.bench.envs:CheapEnv", "config": {"num_agents": 2}},
            "policies": {"shared": {}},
            "torch_threads": torch_threads,
        }
    )
    torch_before = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):  # restores the process's limits after
        torch.set_num_threads(2)
        try:
            with EnvRunner(config):
                assert _blas_threads() == {expected}
                assert torch.get_num_threads() == expected
        finally:
            torch.set_num_threads(torch_before)
