"""The sampling hot path's shortcuts change no result: column-wise numpy mlp, log-prob
shifted by the chosen logit, policy_input/distribute_actions fast paths, one-allocation
flags, zero-reward rounds, single-part Dict obs, check_action_mask's reductions.

Each case pins the result the code had before those changes (or torch's, which it copies).
The review found two that did change, since mended: log-probs of -inf logits and of a
certain action (sampler), and zero-reward rounds holding a None or array reward.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from mpe2 import simple_spread_v3
from torch import nn

from connectors.agent.obs_preprocessor import ObsPreprocessorConnector
from connectors.base import ConnectorContext
from connectors.data import AgentRows
from marl_runner import EnvRunner, RunnerConfig, check_batch_invariants
from marl_runner.policy.action_heads import CategoricalHead
from marl_runner.policy.action_spaces import check_action_mask
from marl_runner.policy.models import MLPModel
from marl_runner.policy.numpy_mlp import NumpyMLP
from marl_runner.policy.numpy_sampling import NumpyCategoricalSampler
from marl_runner.sampling.policy_outputs import distribute_actions, policy_input
from marl_runner.sampling.rewards import count_rewards_on_rows
from marl_runner.sampling.round import PolicyRows
from marl_runner.sampling.trajectories import KeyTable

INF = np.inf


# ---- numpy mlp: column-wise products


def _torch_outputs(model: nn.Module, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        logits, values = model(torch.from_numpy(np.array(rows, order="C")))
    return logits.numpy(), values.numpy()


def _assert_matches_torch(numpy_mlp: NumpyMLP, model: nn.Module, rows: np.ndarray) -> None:
    outputs = numpy_mlp(rows)
    assert outputs is not None, "the numpy forward declined a model it should run"
    logits, values = outputs
    expected_logits, expected_values = _torch_outputs(model, rows)
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values, expected_values, rtol=1e-5, atol=1e-5)
    assert logits.shape == expected_logits.shape and values.shape == (len(rows),)
    assert logits.dtype == values.dtype == np.float32 and logits.flags.c_contiguous
    assert not np.shares_memory(logits, rows) and not np.shares_memory(values, rows)


def _layouts(rows: np.ndarray) -> dict[str, np.ndarray]:
    """The same rows as C, Fortran, strided (a column slice) and read-only arrays."""
    wide = np.repeat(rows, 2, axis=1)
    read_only = rows.copy()
    read_only.flags.writeable = False
    return {
        "c": rows,
        "fortran": np.asfortranarray(rows),
        "strided": wide[:, ::2],
        "read_only": read_only,
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"vf_share_layers": True},
        {"hidden": [8], "activation": "relu", "vf_share_layers": True},
        {"hidden": [], "vf_share_layers": True},
    ],
)
@pytest.mark.parametrize("num_outputs", [1, 5])
@pytest.mark.parametrize("num_rows", [0, 1, 2, 257])
def test_numpy_mlp_matches_torch_for_any_row_count_and_input_layout(
    kwargs: dict, num_outputs: int, num_rows: int
) -> None:
    torch.manual_seed(0)
    model = MLPModel(6, num_outputs, **kwargs).eval()
    numpy_mlp = NumpyMLP(model)
    rows = np.random.default_rng(num_rows).uniform(-2, 2, (num_rows, 6)).astype(np.float32)
    for name, layout in _layouts(rows).items():
        before = layout.copy()
        _assert_matches_torch(numpy_mlp, model, layout)
        np.testing.assert_array_equal(layout, before, err_msg=f"{name} input was written to")


def test_numpy_mlp_outputs_of_two_calls_do_not_alias() -> None:
    torch.manual_seed(0)
    model = MLPModel(6, 1, hidden=[], vf_share_layers=True).eval()  # the fewest copies
    numpy_mlp = NumpyMLP(model)
    rows = np.asfortranarray(np.random.default_rng(0).uniform(-1, 1, (4, 6)).astype(np.float32))
    first_logits, first_values = numpy_mlp(rows)
    kept = first_logits.copy(), first_values.copy()
    second_logits, second_values = numpy_mlp(rows)
    second_logits += 100.0
    second_values += 100.0
    np.testing.assert_array_equal(first_logits, kept[0])
    np.testing.assert_array_equal(first_values, kept[1])


@pytest.mark.parametrize("vf_share_layers", [False, True])
def test_numpy_mlp_follows_weights_given_new_strides_in_place(vf_share_layers: bool) -> None:
    """t_() on a square weight and as_strided_ keep the memory but change the strides: the
    views are taken again, and weight @ columns is right for a non-contiguous weight."""
    torch.manual_seed(0)
    model = MLPModel(6, 3, hidden=[8, 8], vf_share_layers=vf_share_layers).eval()
    numpy_mlp = NumpyMLP(model)
    rows = np.random.default_rng(1).uniform(-1, 1, (9, 6)).astype(np.float32)
    _assert_matches_torch(numpy_mlp, model, rows)
    with torch.no_grad():
        model.policy_trunk[2].weight.t_()
        model.logits.weight.as_strided_((3, 8), (1, 3))
    assert not model.logits.weight.is_contiguous()
    _assert_matches_torch(numpy_mlp, model, rows)


@pytest.mark.parametrize("vf_share_layers", [False, True])
def test_numpy_mlp_follows_load_state_dict_with_assign(vf_share_layers: bool) -> None:
    torch.manual_seed(0)
    model = MLPModel(6, 4, hidden=[16], vf_share_layers=vf_share_layers).eval()
    numpy_mlp = NumpyMLP(model)
    rows = np.random.default_rng(2).uniform(-1, 1, (7, 6)).astype(np.float32)
    _assert_matches_torch(numpy_mlp, model, rows)
    state = {name: torch.randn_like(value) for name, value in model.state_dict().items()}
    model.load_state_dict(state, assign=True)
    _assert_matches_torch(numpy_mlp, model, rows)


def test_numpy_mlp_with_shared_layers_leaves_a_hooked_trunk_to_torch() -> None:
    torch.manual_seed(0)
    model = MLPModel(6, 4, vf_share_layers=True).eval()
    numpy_mlp = NumpyMLP(model)
    rows = np.random.default_rng(3).uniform(-1, 1, (5, 6)).astype(np.float32)
    _assert_matches_torch(numpy_mlp, model, rows)
    handle = model.policy_trunk.register_forward_pre_hook(lambda module, args: None)
    assert numpy_mlp(rows) is None
    handle.remove()
    _assert_matches_torch(numpy_mlp, model, rows)


def test_bare_loop_numpy_forward_matches_torch_on_simple_spread() -> None:
    """The bare loop's numpy model (same NumpyMLP) on real Box obs of mpe2 simple_spread."""
    from marl_runner.bench.bare_loop import BareLoop
    from marl_runner.bench.workloads import get_workload

    env = simple_spread_v3.parallel_env(N=3)
    observations = []
    obs, _ = env.reset(seed=0)
    for _ in range(4):
        observations += list(obs.values())
        obs, *_ = env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    env.close()
    loop = BareLoop(get_workload("spread").config(), "numpy")
    try:
        for policy in loop.policies.values():
            rows, mask = policy.prepare(observations)
            assert mask is None
            _assert_matches_torch(policy.numpy_model, policy.model, rows)
        assert loop.run(min_rounds=3).agent_steps > 0
    finally:
        loop.stop()


# ---- numpy sampler: log-prob shifted by the chosen logit


def _torch_logp(dist_inputs: np.ndarray, actions: np.ndarray, start: int) -> np.ndarray:
    head = CategoricalHead(gym.spaces.Discrete(dist_inputs.shape[1], start=start))
    return head.log_prob(torch.from_numpy(dist_inputs), torch.from_numpy(actions)).numpy()


def _reference_logp(dist_inputs: np.ndarray, index: np.ndarray) -> np.ndarray:
    """log_softmax of the chosen entries in float64, shifted by the row max."""
    x = dist_inputs.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        normaliser = np.log(np.exp(x - top).sum(axis=1)) + top[:, 0]
    return x[np.arange(len(x)), index] - normaliser


EXTREME_ROWS = [
    ([1e30, -1e30, 0.0, 5.0], None),
    ([3e37, -3e37, 0.0, 1.0], None),
    ([-INF, 1.0, 2.0, 3.0], None),
    ([1.0, -INF, -INF, 3.0], [1, 0, 0, 1]),
    ([1.0, 5.0, 2.0, 3.0], [0, 0, 1, 0]),
    ([1.0, 5.0, 3e38, 3.0], [0, 0, 1, 0]),
    ([1.0, 5.0, -3e38, 3.0], [0, 0, 1, 0]),
    ([-20.0, 0.0, 1e-30, -1e-30], [1, 0, 1, 1]),
]


@pytest.mark.parametrize("explore", [False, True])
@pytest.mark.parametrize("start", [0, -2, 3])
@pytest.mark.parametrize("logits, allowed", EXTREME_ROWS)
def test_sampler_logp_on_extreme_logits_is_torch_s(
    explore: bool, start: int, logits: list, allowed: list | None
) -> None:
    rows = np.array([logits] * 64, np.float32)
    mask = None if allowed is None else np.array([allowed] * 64, bool)
    sampler = NumpyCategoricalSampler(4, start, seed=7)
    with np.errstate(over="ignore"):  # FLOAT_MIN - 3e38 overflows, as it did before
        actions, logp, dist_inputs = sampler.act(rows, mask, explore)
    index = actions - start
    if mask is not None:
        assert mask[np.arange(64), index].all()
    assert np.isfinite(logp).all() and (logp <= 0).all()
    np.testing.assert_allclose(logp, _torch_logp(dist_inputs, actions, start), atol=1e-5)
    np.testing.assert_allclose(logp, _reference_logp(dist_inputs, index), atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 8.0, 30.0, 1e4, 1e30])
def test_sampler_logp_exploring_any_spread_matches_float64(scale: float) -> None:
    """Exploring, the chosen logit may lie below the row max (~21 at most): the shifted
    exponentials stay finite and the log-prob is the float64 one."""
    rng = np.random.default_rng(int(np.log10(scale) * 10) + 1)
    logits = (rng.standard_normal((4000, 6)) * scale).astype(np.float32)
    mask = rng.random((4000, 6)) < 0.6
    mask[np.arange(4000), rng.integers(6, size=4000)] = True
    for row_mask in (None, mask):
        actions, logp, dist_inputs = NumpyCategoricalSampler(6, 0, seed=1).act(
            logits, row_mask, True
        )
        assert np.isfinite(logp).all()
        np.testing.assert_allclose(logp, _reference_logp(dist_inputs, actions), atol=2e-5)


def test_sampler_nan_and_all_minus_inf_rows_give_nan_logp_as_torch() -> None:
    logits = np.array([[0.0, np.nan, 1.0], [-INF, -INF, -INF], [0.0, 1.0, 2.0]], np.float32)
    for explore in (False, True):
        with np.errstate(invalid="ignore"):  # -inf - -inf, as before the change
            actions, logp, dist_inputs = NumpyCategoricalSampler(3, 0, seed=0).act(
                logits, None, explore
            )
        expected = _torch_logp(dist_inputs, actions, 0)
        np.testing.assert_array_equal(np.isnan(logp), np.isnan(expected))
        assert np.isnan(logp[:2]).all() and np.isfinite(logp[2])


@pytest.mark.parametrize("explore", [False, True])
def test_sampler_logp_is_minus_inf_when_every_allowed_logit_is_minus_inf(explore: bool) -> None:
    """A diverged model's -inf logits on every legal action: torch's log-prob is -inf."""
    logits = np.array([[-INF, 1.0, 2.0], [-INF, -INF, 2.0]], np.float32)
    mask = np.array([[1, 0, 0], [1, 1, 0]], bool)
    with np.errstate(invalid="ignore"):
        actions, logp, dist_inputs = NumpyCategoricalSampler(3, 0, seed=0).act(
            logits, mask, explore
        )
    np.testing.assert_array_equal(_torch_logp(dist_inputs, actions, 0), [-INF, -INF])
    np.testing.assert_array_equal(logp, [-INF, -INF])


def test_sampler_logp_of_a_certain_action_is_plus_zero() -> None:
    logits = np.array([[1.0, 5.0, 2.0], [1e30, 0.0, 0.0]], np.float32)
    mask = np.array([[0, 0, 1], [1, 1, 1]], bool)
    actions, logp, dist_inputs = NumpyCategoricalSampler(3, 0, seed=0).act(logits, mask, False)
    expected = _torch_logp(dist_inputs, actions, 0)
    assert not np.signbit(expected).any()
    np.testing.assert_array_equal(np.signbit(logp), np.signbit(expected))


def test_sampler_row_index_cache_is_private_and_bounded() -> None:
    """Many distinct row counts (past the cache's size) keep giving right log-probs; the
    cached aranges cannot be written to and never leave the sampler."""
    sampler = NumpyCategoricalSampler(5, 0, seed=0)
    rng = np.random.default_rng(0)
    for num_rows in [*range(1, 140), 3, 1, 64, 65]:
        logits = rng.standard_normal((num_rows, 5)).astype(np.float32)
        actions, logp, dist_inputs = sampler.act(logits, None, bool(num_rows % 2))
        np.testing.assert_allclose(logp, _reference_logp(dist_inputs, actions), atol=1e-5)
        for cached in sampler._rows.values():
            assert not cached.flags.writeable
            assert not any(np.shares_memory(cached, out) for out in (actions, logp))
    assert len(sampler._rows) <= 64
    with pytest.raises(ValueError, match="read-only"):
        sampler._row_indices(4)[0] = 3


# ---- policy_input and distribute_actions


def _rows(done: list[bool], mask: Any, agent_ids: Any = None) -> AgentRows:
    n = len(done)
    columns = {
        "obs": np.zeros((n, 2), np.float32),
        "terminateds": np.array(done, bool),
        "truncateds": np.zeros(n, bool),
        "env_ids": np.arange(n, dtype=np.int64) // 2,
        "agent_ids": agent_ids if agent_ids is not None else np.array(
            [f"a{i}" for i in range(n)], object
        ),
        "keys": np.arange(n, dtype=np.int64),
    }
    if mask is not None:
        columns["action_mask"] = mask
    return AgentRows(columns)


@pytest.mark.parametrize("kind", ["bool", "int8", "list"])
def test_policy_input_opens_done_rows_masks_and_keeps_the_stored_mask(kind: str) -> None:
    env_mask = np.array([[1, 0, 0], [0, 0, 0], [0, 1, 1], [0, 0, 0]], np.int8)
    mask = {"bool": env_mask.astype(bool), "int8": env_mask, "list": env_mask.tolist()}[kind]
    kept = np.array(mask, copy=True)
    rows = _rows([False, True, False, True], mask)
    acting, inputs = policy_input(rows)
    np.testing.assert_array_equal(acting, [0, 2])
    opened = np.asarray(inputs["action_mask"])
    np.testing.assert_array_equal(opened != 0, [[1, 0, 0], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    assert opened.dtype == np.asarray(kept).dtype
    np.testing.assert_array_equal(np.asarray(rows["action_mask"]), kept)  # not written to
    assert inputs is not rows and inputs["obs"] is rows["obs"]


def test_policy_input_without_done_rows_or_with_every_row_done() -> None:
    mask = np.ones((3, 2), bool)
    rows = _rows([False, False, False], mask)
    assert policy_input(rows) == (None, rows)
    rows = _rows([True, True, True], mask)
    acting, inputs = policy_input(rows)
    assert acting is not None and acting.size == 0 and inputs is rows
    unmasked = _rows([False, True, False], None)
    acting, inputs = policy_input(unmasked)
    np.testing.assert_array_equal(acting, [0, 2])
    assert inputs is unmasked


def _expected(rows: AgentRows, per_row: list, acting: list[int]) -> dict:
    expected: dict = {}
    for i in acting:
        expected.setdefault(int(rows["env_ids"][i]), {})[rows["agent_ids"][i]] = per_row[i]
    return expected


def _distributed(rows: AgentRows, actions: Any, acting: np.ndarray | None) -> dict:
    actions_by_env: dict = {env_id: {} for env_id in set(rows["env_ids"].tolist())}
    distribute_actions(actions_by_env, rows, actions, acting)
    return {env_id: given for env_id, given in actions_by_env.items() if given}


def _assert_same_actions(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for env_id, given in expected.items():
        assert got[env_id].keys() == given.keys()
        for agent_id, action in given.items():
            sent = got[env_id][agent_id]
            pairs = zip(_leaves(sent), _leaves(action), strict=True)
            assert all(np.array_equal(a, b) for a, b in pairs), (env_id, agent_id, sent, action)


def _leaves(value: Any) -> list:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    return [value]


AGENT_IDS = {
    "str": None,
    "tuples": np.array([None] * 5, object),
    "list": [("team", i) for i in range(5)],
}
AGENT_IDS["tuples"][:] = [("blue", 0), ("blue", 1), ("red", 0), ("red", 1), ("red", 2)]


@pytest.mark.parametrize("ids", list(AGENT_IDS))
@pytest.mark.parametrize("space", ["discrete", "multi_discrete", "box", "dict"])
@pytest.mark.parametrize("done", [[False, True, False, False, True], [False] * 5])
def test_distribute_actions_sends_each_acting_row_its_own_action(
    ids: str, space: str, done: list[bool]
) -> None:
    rows = _rows(done, None, AGENT_IDS[ids])
    acting, _ = policy_input(rows)
    rng = np.random.default_rng(0)
    if space == "discrete":
        actions: Any = rng.integers(0, 7, 5)
        per_row = actions.tolist()
    elif space == "multi_discrete":
        actions = rng.integers(0, 3, (5, 2))
        per_row = list(actions)
    elif space == "box":
        actions = rng.standard_normal((5, 3)).astype(np.float32)
        per_row = list(actions)
    else:
        actions = {"move": rng.integers(0, 4, 5), "aim": rng.standard_normal((5, 2))}
        per_row = [{"move": actions["move"][i], "aim": actions["aim"][i]} for i in range(5)]
    kept = {k: v.copy() for k, v in actions.items()} if space == "dict" else actions.copy()
    live = [i for i in range(5) if not done[i]]
    got = _distributed(rows, actions, acting)
    _assert_same_actions(got, _expected(rows, per_row, live))
    if space == "discrete":
        assert all(type(a) is int for given in got.values() for a in given.values())
    if space == "dict":
        assert all(np.array_equal(actions[k], kept[k]) for k in kept)
    else:
        np.testing.assert_array_equal(actions, kept)


# ---- round flags, zero-reward rounds, single-part Dict obs, mask checks


def _key_table(num_keys: int) -> tuple[KeyTable, list[int]]:
    table = KeyTable(8)
    episode = SimpleNamespace(env_id=0, episode_id=1, start_step=0, training_enabled=True)
    return table, [table.allocate(episode, i, f"a{i}") for i in range(num_keys)]


@pytest.mark.parametrize("num_rows", [0, 1, 4])
def test_round_flags_are_independent_columns(num_rows: int) -> None:
    table, keys = _key_table(num_rows)
    rows = PolicyRows()
    for i, key in enumerate(keys):
        rows.add(np.zeros(2, np.float32), 0.0, None, key, i == 1, i == 2, i == 3)
    agent_rows = rows.to_agent_rows(table)
    flags = {name: agent_rows[name] for name in ("terminateds", "truncateds", "is_first")}
    for name, marked in (("terminateds", 1), ("truncateds", 2), ("is_first", 3)):
        column = flags[name]
        assert column.shape == (num_rows,) and column.dtype == np.bool_
        np.testing.assert_array_equal(np.flatnonzero(column), [marked][: num_rows > marked])
    flags["terminateds"][:] = True  # a connector rewriting one flag touches no other
    assert np.count_nonzero(flags["truncateds"]) == (num_rows > 2)
    assert np.count_nonzero(flags["is_first"]) == (num_rows > 3)


@pytest.mark.parametrize(
    "rewards",
    [
        [0.0, 0.0, 0.0],
        [np.float32(0.0), np.float64(-0.0), 0],
        [False, 0, np.array(0.0)],
        np.zeros(3),
        [0.0, 1.5, -2.0],
        [np.nan, 0.0, 0.0],
        np.array([0.0, 0.0, 2.0]),
    ],
)
def test_count_rewards_on_rows_adds_what_it_stores(rewards: Any) -> None:
    """Key totals grow by exactly the stored column (credited rows aside), zero rounds or not."""
    totals = np.arange(6, dtype=np.float64)
    keys = np.array([4, 1, 3])
    before = totals.copy()
    column = count_rewards_on_rows(totals, keys, rewards, [])
    assert column.dtype == np.float32 and column.shape == (3,)
    expected = before.copy()
    expected[keys] += np.array(rewards, np.float64)
    np.testing.assert_array_equal(totals, expected)
    np.testing.assert_array_equal(np.signbit(totals), np.signbit(expected))
    credited = before.copy()
    count_rewards_on_rows(credited, keys, rewards, [0, 1, 2])
    np.testing.assert_array_equal(credited, before)


def test_count_rewards_on_rows_counts_a_none_reward_as_the_column_shows_it() -> None:
    totals = np.zeros(3)
    column = count_rewards_on_rows(totals, np.array([0, 2]), [None, 0.0], [])
    assert np.isnan(column[0])
    assert np.isnan(totals[0]), "the rewards column holds NaN but the key total does not"


def test_count_rewards_on_rows_rejects_array_rewards_on_zero_rounds_too() -> None:
    with pytest.raises(ValueError):
        count_rewards_on_rows(np.zeros(3), np.array([0, 2]), [np.ones(1), np.zeros(1)], [])
    with pytest.raises(ValueError):
        count_rewards_on_rows(np.zeros(3), np.array([0, 2]), [np.zeros(1), np.zeros(1)], [])


def _obs_connector(obs_space: gym.Space) -> ObsPreprocessorConnector:
    ctx = ConnectorContext(observation_space=obs_space, action_space=gym.spaces.Discrete(3))
    connector = ObsPreprocessorConnector(ctx)
    connector.bind_input_space(obs_space)
    return connector


@pytest.mark.parametrize("size", [3, 1100])
def test_single_part_dict_obs_is_a_fresh_array(size: int) -> None:
    """A Dict obs beside its mask is one part: its block is returned without a copy, so it
    must not be (a view of) the env's own arrays, which an env may reuse in place."""
    space = gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(-1, 1, (size,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (3,), np.int8),
        }
    )
    connector = _obs_connector(space)
    env_arrays = [np.full(size, i, np.float32) for i in range(2)]
    obs = [{"observation": a, "action_mask": np.ones(3, np.int8)} for a in env_arrays]
    out = connector(AgentRows({"obs": obs, "infos": [{}, {}]}))["obs"]
    np.testing.assert_array_equal(out, np.stack(env_arrays))
    assert out.dtype == np.float32 and out.shape == (2, size)
    assert not any(np.shares_memory(out, a) for a in env_arrays)
    single = _obs_connector(gym.spaces.Tuple([gym.spaces.Box(-1, 1, (size,), np.float32)]))
    out = single(AgentRows({"obs": [(a,) for a in env_arrays], "infos": [{}, {}]}))["obs"]
    assert not any(np.shares_memory(out, a) for a in env_arrays)


def test_check_action_mask_reductions_keep_their_answers() -> None:
    discrete = gym.spaces.Discrete(3)
    assert check_action_mask(np.zeros((0, 3), np.int8), discrete, 0).shape == (0, 3)
    mask = np.array([[1, 0, 0], [0, 2, 1]], np.int8)
    allowed = check_action_mask(mask, discrete, 2)
    assert allowed.dtype == np.bool_
    np.testing.assert_array_equal(allowed, mask != 0)
    assert check_action_mask(allowed, discrete, 2) is allowed
    with pytest.raises(ValueError, match=r"row 1 allows no action \(2 of 3 rows"):
        check_action_mask(np.array([[1, 0, 0], [0, 0, 0], [0, 0, 0]], bool), discrete, 3)
    multi = gym.spaces.MultiDiscrete([2, 3])
    assert check_action_mask(np.zeros((0, 5), bool), multi, 0).shape == (0, 5)
    with pytest.raises(ValueError, match="row 0 allows no action for dimension 1"):
        check_action_mask(np.array([[1, 0, 0, 0, 0]], np.int8), multi, 1)


# ---- end to end on real PettingZoo envs


def _evaluate_agrees(runner: EnvRunner, batch: Any) -> None:
    for policy_id, policy_batch in batch.policy_batches.items():
        policy = runner.policy_map[policy_id]
        logp, _, values = policy.evaluate(policy_batch)
        np.testing.assert_allclose(
            logp.detach().numpy(), policy_batch["action_logp"], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            values.detach().numpy(), policy_batch["vf_preds"], rtol=1e-5, atol=1e-5
        )


def test_connect_four_runner_honours_masks_across_game_ends() -> None:
    """Games end (done rows among acting ones, final masks that may allow nothing): every
    sent action was legal and the stored log-probs are what evaluate() computes."""
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "pettingzoo.classic.connect_four_v3:env", "api": "aec"},
            "num_envs": 3,
            "batch_mode": "complete_episodes",
            "seed": 4,
            "policies": {"p": {"model": {"type": "mlp", "hidden": [16]}}},
        }
    )
    with EnvRunner(config) as runner:
        batch = runner.sample(num_episodes=6)
        check_batch_invariants(batch)
        _evaluate_agrees(runner, batch)
    for policy_batch in batch.policy_batches.values():
        live = ~(policy_batch["terminateds"] | policy_batch["truncateds"])
        mask = policy_batch["action_mask"][live]
        assert mask[np.arange(len(mask)), policy_batch["actions"][live]].all()


def test_simple_spread_runner_with_shared_layers_stores_what_evaluate_computes() -> None:
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "mpe2.simple_spread_v3:parallel_env", "config": {"max_cycles": 10}},
            "num_envs": 2,
            "rollout_fragment_length": 25,
            "seed": 2,
            "policies": {
                "shared": {"model": {"type": "mlp", "hidden": [32], "vf_share_layers": True}}
            },
        }
    )
    with EnvRunner(config) as runner:
        batch = runner.sample()
        check_batch_invariants(batch)
        _evaluate_agrees(runner, batch)
