"""Each built-in agent connector on its own: values and output spaces."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from helpers_connectors import make_rows
from pettingzoo.classic import tictactoe_v3

from connectors import (
    ActionRows,
    AgentConnectorDataType,
    ClipRewardAgentConnector,
    ConnectorContext,
    ConnectorError,
    FlattenDataAgentConnector,
    LambdaAgentConnector,
    MeanStdObservationFilterAgentConnector,
    ObsPreprocessorConnector,
    StateBufferConnector,
    ViewRequirementAgentConnector,
    get_connector,
    register_lambda_agent_connector,
)

BOX = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
DISCRETE_ACTIONS = gym.spaces.Discrete(4)


def ctx_for(obs_space, action_space=DISCRETE_ACTIONS, **kwargs) -> ConnectorContext:
    return ConnectorContext(obs_space, action_space, **kwargs)


def bound(connector, space=None):
    """Bind like a pipeline would and return (connector, output space)."""
    out = connector.bind_input_space(space or connector.ctx.observation_space)
    return connector, out


# --- ObsPreprocessorConnector ----------------------------------------------


def test_preprocessor_box_fast_path():
    ctx = ctx_for(BOX, gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    conn, out_space = bound(ObsPreprocessorConnector(ctx))
    assert out_space == gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    obs = [np.full((2, 3), i, np.float32) for i in range(3)]
    rows = conn(make_rows(obs))
    assert rows["obs"].dtype == np.float32 and rows["obs"].shape == (3, 6)
    np.testing.assert_array_equal(rows["obs"][:, 0], [0, 1, 2])
    assert "action_mask" not in rows  # masks only exist for discrete actions


def test_preprocessor_rejects_wrong_shape():
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(BOX)))
    with pytest.raises(ConnectorError, match=r"shape \(2, 3\)"):
        conn(make_rows([np.zeros(6, np.float32)]))


@pytest.mark.parametrize("sizes", [(1025, 1023), (1024, 1023)])
def test_preprocessor_large_obs_of_another_size_are_refused_not_shifted(sizes):
    """(Found by a probe.) Large Box obs (the concatenate path): one row a value too long
    and the next a value short add up to the right total, but must not come out with the
    second row's values shifted by one."""
    space = gym.spaces.Box(-1.0, 1.0, (1024,), np.float32)
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(space)))
    good = conn(make_rows([np.ones(1024, np.float32), np.zeros(1024, np.float32)]))
    assert good["obs"].shape == (2, 1024) and good["obs"][1].sum() == 0
    with pytest.raises(ConnectorError, match=r"do not stack to shape \(1024,\)"):
        conn(make_rows([np.ones(size, np.float32) for size in sizes]))


def test_preprocessor_discrete_and_multidiscrete_one_hot():
    conn, out_space = bound(ObsPreprocessorConnector(ctx_for(gym.spaces.Discrete(3, start=1))))
    assert out_space.shape == (3,)
    rows = conn(make_rows([1, np.int64(2), 3]))
    np.testing.assert_array_equal(rows["obs"], np.eye(3, dtype=np.float32))
    with pytest.raises(ConnectorError, match="outside"):
        conn(make_rows([0]))

    conn, out_space = bound(ObsPreprocessorConnector(ctx_for(gym.spaces.MultiDiscrete([2, 3]))))
    assert out_space.shape == (5,)
    rows = conn(make_rows([np.array([1, 0]), np.array([0, 2])]))
    np.testing.assert_array_equal(rows["obs"], [[0, 1, 1, 0, 0], [1, 0, 0, 0, 1]])


def test_preprocessor_dict_and_tuple_flatten_recursively_in_key_order():
    space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(0.0, 5.0, (2,), np.float32),
            "kind": gym.spaces.Discrete(2),
            "more": gym.spaces.Tuple((gym.spaces.MultiBinary(2), gym.spaces.Discrete(3))),
        }
    )
    conn, out_space = bound(ObsPreprocessorConnector(ctx_for(space)))
    assert out_space.shape == (2 + 2 + 3 + 2,)
    sample = {"pos": np.array([4.0, 5.0], np.float32), "kind": 1, "more": (np.array([1, 0]), 2)}
    rows = conn(make_rows([sample]))
    # gymnasium sorts Dict keys: kind, more, pos
    np.testing.assert_array_equal(rows["obs"][0], [0, 1, 1, 0, 0, 0, 1, 4, 5])
    np.testing.assert_array_equal(out_space.high, [1, 1, 1, 1, 1, 1, 1, 5, 5])
    # matches gymnasium's own flattening
    np.testing.assert_array_equal(rows["obs"][0], gym.spaces.flatten(space, sample))


def test_preprocessor_unsupported_space_fails_at_bind():
    with pytest.raises(ConnectorError, match="Text"):
        ObsPreprocessorConnector(ctx_for(gym.spaces.Text(5))).bind_input_space(gym.spaces.Text(5))


def test_preprocessor_tictactoe_puts_action_mask_aside():
    env = tictactoe_v3.env()
    env.reset(seed=0)
    space = env.observation_space("player_1")
    conn, out_space = bound(ObsPreprocessorConnector(ctx_for(space, env.action_space("player_1"))))
    assert out_space == gym.spaces.Box(0.0, 1.0, (18,), np.float32)  # the mask is not obs
    first = env.observe("player_1")
    env.step(4)
    second = env.observe("player_2")
    rows = conn(make_rows([first, second]))
    assert rows["obs"].shape == (2, 18)
    np.testing.assert_array_equal(rows["obs"][1], second["observation"].ravel())
    assert rows["action_mask"].dtype == np.int8 and rows["action_mask"].shape == (2, 9)
    assert rows["action_mask"][0].all() and rows["action_mask"][1, 4] == 0


def test_preprocessor_masks_from_infos_fill_missing_with_ones():
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(BOX, gym.spaces.Discrete(3))))
    obs = [np.zeros((2, 3), np.float32)] * 3
    rows = conn(make_rows(obs, infos=[{"action_mask": [0, 1, 1]}, {}, {"other": 1}]))
    np.testing.assert_array_equal(rows["action_mask"], [[0, 1, 1], [1, 1, 1], [1, 1, 1]])
    assert rows["action_mask"].dtype == np.int8
    # the column is there in every round (all-ones without masks), so it never comes and goes
    rows = conn(make_rows(obs[:2]))
    np.testing.assert_array_equal(rows["action_mask"], np.ones((2, 3)))
    with pytest.raises(ConnectorError, match="3 entries"):
        conn(make_rows(obs[:1], infos=[{"action_mask": [1, 0]}]))


def test_preprocessor_multidiscrete_info_masks():
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(BOX, gym.spaces.MultiDiscrete([2, 3]))))
    rows = conn(make_rows([np.zeros((2, 3))] * 2, infos=[{"action_mask": [1, 0, 0, 1, 1]}, {}]))
    np.testing.assert_array_equal(rows["action_mask"], [[1, 0, 0, 1, 1], [1, 1, 1, 1, 1]])


def test_preprocessor_can_ignore_info_masks():
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(BOX), masks_from_infos=False))
    rows = conn(make_rows([np.zeros((2, 3))], infos=[{"action_mask": [1, 0, 0, 0]}]))
    assert "action_mask" not in rows


def test_preprocessor_empty_round():
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(BOX)))
    assert conn(make_rows([]))["obs"].shape == (0, 6)


# --- FlattenDataAgentConnector ---------------------------------------------


def test_flatten_nested_columns():
    space = gym.spaces.Dict(
        {"b": gym.spaces.Box(-2.0, 2.0, (2,), np.float32), "a": gym.spaces.Discrete(4)}
    )
    conn, out_space = bound(FlattenDataAgentConnector(ctx_for(space)))
    np.testing.assert_array_equal(out_space.low, [0, -2, -2])
    np.testing.assert_array_equal(out_space.high, [3, 2, 2])
    rows = make_rows([{"a": 3, "b": np.array([0.5, 1.5])}, {"a": 1, "b": np.array([2.0, 0.0])}])
    rows["state_in_0"] = np.zeros((2, 3, 4))
    rows["extra"] = np.zeros((2, 2, 2))
    rows = conn(rows)
    np.testing.assert_array_equal(rows["obs"], [[3, 0.5, 1.5], [1, 2.0, 0.0]])
    assert rows["obs"].dtype == np.float32
    assert rows["extra"].shape == (2, 4)
    assert rows["state_in_0"].shape == (2, 3, 4)  # RNN state keeps its shape
    assert rows["rewards"].shape == (2,)  # scalars per row stay a [n] column
    assert rows["infos"] == [{}, {}]


# --- ClipRewardAgentConnector ----------------------------------------------


@pytest.mark.parametrize(
    ("sign", "limit", "expected"),
    [(False, None, [-3, -0.5, 0, 2]), (True, None, [-1, -1, 0, 1]), (False, 1.0, [-1, -0.5, 0, 1])],
)
def test_clip_reward(sign, limit, expected):
    conn = ClipRewardAgentConnector(ctx_for(BOX), sign=sign, limit=limit)
    rows = conn(make_rows([np.zeros((2, 3))] * 4, rewards=[-3, -0.5, 0, 2]))
    np.testing.assert_array_equal(rows["rewards"], expected)
    assert rows["rewards"].dtype == np.float32


def test_clip_reward_rejects_bad_limit():
    with pytest.raises(ConnectorError, match="limit"):
        ClipRewardAgentConnector(ctx_for(BOX), limit=-1)


# --- MeanStdObservationFilterAgentConnector --------------------------------

FLAT = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


def feed(conn, data):
    return conn(make_rows(list(data)))["obs"]


def test_filter_normalises_with_running_statistics():
    rng = np.random.default_rng(0)
    conn, out_space = bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT), clip=None))
    assert out_space.shape == (3,)
    data = rng.normal(5.0, 3.0, size=(500, 3)).astype(np.float32)
    feed(conn, data[:200])
    normalised = feed(conn, data[200:])
    mean, std = data.mean(0), data.std(0)
    np.testing.assert_allclose(normalised, (data[200:] - mean) / std, rtol=1e-4, atol=1e-4)
    state = conn.get_state()
    assert state["count"] == 500
    np.testing.assert_allclose(state["mean"], mean, rtol=1e-5)


def test_filter_clips_and_leaves_constant_features_centred():
    conn, out_space = bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT), clip=1.0))
    assert out_space.high.max() == 1.0
    out = feed(conn, [[0, 7, 0], [0, 7, 100]])
    assert out[1, 2] == 1.0  # clipped
    np.testing.assert_array_equal(out[:, 1], [0, 0])  # std 0 -> only centred


def test_filter_frozen_in_eval():
    conn, _ = bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT)))
    feed(conn, [[1, 2, 3], [3, 4, 5]])
    before = conn.get_state()
    conn.in_eval()
    out = feed(conn, [[100, 100, 100]])
    assert conn.get_state() == before
    assert out.max() == 10.0  # still normalised (and clipped) with the frozen stats
    conn.in_training()
    feed(conn, [[100, 100, 100]])
    assert conn.get_state()["count"] == 3


def test_filter_merge_states_equals_statistics_of_the_union():
    rng = np.random.default_rng(1)
    data = rng.normal(size=(300, 3)) * [1, 10, 100] + [0, -5, 50]
    parts = [data[:10], data[10:130], data[130:]]
    states = []
    for part in parts:
        conn, _ = bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT)))
        feed(conn, part[:5])
        feed(conn, part[5:])
        states.append(conn.get_state())
    merged = MeanStdObservationFilterAgentConnector.merge_states(states)
    union, _ = bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT)))
    feed(union, data)
    assert merged["count"] == 300
    np.testing.assert_allclose(merged["mean"], union.get_state()["mean"], rtol=1e-6)
    np.testing.assert_allclose(merged["m2"], union.get_state()["m2"], rtol=1e-6)
    np.testing.assert_allclose(merged["mean"], data.astype(np.float32).mean(0), rtol=1e-5)
    np.testing.assert_allclose(
        np.array(merged["m2"]) / 300, data.astype(np.float32).var(0), rtol=1e-5
    )


def test_filter_sync_through_deltas_counts_nothing_twice():
    rng = np.random.default_rng(2)
    data = rng.normal(size=(40, 3))
    runners = [bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT)))[0] for _ in range(2)]
    global_state = MeanStdObservationFilterAgentConnector.merge_states([runners[0].get_state()])
    for round_data in (data[:20], data[20:]):
        feed(runners[0], round_data[:8])
        feed(runners[1], round_data[8:])
        global_state = MeanStdObservationFilterAgentConnector.merge_states(
            [global_state] + [r.pop_delta() for r in runners]
        )
        for r in runners:
            r.set_state(global_state)
    assert global_state["count"] == 40
    np.testing.assert_allclose(global_state["mean"], data.astype(np.float32).mean(0), rtol=1e-5)
    assert runners[1].get_state() == global_state


def test_filter_state_round_trip_is_exact():
    conn, _ = bound(MeanStdObservationFilterAgentConnector(ctx_for(FLAT), clip=5.0))
    feed(conn, np.random.default_rng(3).normal(size=(17, 3)))
    name, params = conn.to_state()
    params = json.loads(json.dumps(params))
    rebuilt = get_connector(name, ctx_for(FLAT), params)
    assert rebuilt.get_state() == conn.get_state() and rebuilt.clip == 5.0
    x = np.random.default_rng(4).normal(size=(5, 3))
    conn.in_eval()
    rebuilt.in_eval()
    np.testing.assert_array_equal(feed(conn, x), feed(rebuilt, x))


def test_filter_needs_a_box():
    space = gym.spaces.Dict({"a": FLAT})
    with pytest.raises(ConnectorError, match="MeanStdObservationFilterAgentConnector.*Box.*Dict"):
        MeanStdObservationFilterAgentConnector(ctx_for(space)).bind_input_space(space)


def test_filter_state_must_fit_the_space():
    state = {"count": 1, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}
    with pytest.raises(ConnectorError, match="shape"):
        MeanStdObservationFilterAgentConnector(ctx_for(FLAT), state=state).bind_input_space(FLAT)


# --- StateBufferConnector --------------------------------------------------


def policy_output(keys, actions, state_outs=()):
    keys = np.asarray(keys)
    return ActionRows(
        actions=np.asarray(actions),
        state_outs=[np.asarray(s) for s in state_outs],
        keys=keys,
        env_ids=np.zeros(len(keys), np.int64),
        agent_ids=[str(k) for k in keys],
    )


def test_state_buffer_is_a_noop_without_state():
    conn = StateBufferConnector(ctx_for(FLAT))
    rows = conn(make_rows([np.zeros(3)] * 2))
    assert "state_in_0" not in rows
    conn.on_policy_output(policy_output([0, 1], [0, 1]))


def test_state_buffer_per_key():
    ctx = ctx_for(FLAT)
    conn = StateBufferConnector(ctx)
    ctx.initial_states = [np.full(2, -1.0, np.float32), np.zeros((1, 3), np.float32)]  # filled late
    rows = conn(make_rows([np.zeros(3)] * 2, keys=[3, 70], is_first=[True, True]))
    np.testing.assert_array_equal(rows["state_in_0"], [[-1, -1], [-1, -1]])
    assert rows["state_in_1"].shape == (2, 1, 3)
    conn.on_policy_output(policy_output([3, 70], [0, 0], [[[1, 1], [2, 2]], np.ones((2, 1, 3))]))
    # next round: key 70 continues, key 3 starts a new episode, key 5 is new
    rows = conn(make_rows([np.zeros(3)] * 3, keys=[70, 3, 5], is_first=[False, True, False]))
    np.testing.assert_array_equal(rows["state_in_0"], [[2, 2], [-1, -1], [-1, -1]])
    np.testing.assert_array_equal(rows["state_in_1"][0], np.ones((1, 3)))
    # rows the policy did not evaluate keep their state
    conn.on_policy_output(policy_output([70], [0], [[[9, 9]], np.zeros((1, 1, 3))]))
    rows = conn(make_rows([np.zeros(3)] * 2, keys=[3, 70]))
    np.testing.assert_array_equal(rows["state_in_0"], [[-1, -1], [9, 9]])


# --- ViewRequirementAgentConnector -----------------------------------------


def test_view_requirements_noop_without_requests():
    conn = ViewRequirementAgentConnector(ctx_for(FLAT))
    rows = make_rows([np.zeros(3)])
    before = dict(rows.columns)
    assert conn(rows).columns == before
    assert conn.output_observation_space(FLAT) is FLAT


def test_prev_actions_and_prev_rewards():
    ctx = ctx_for(FLAT, gym.spaces.MultiDiscrete([3, 3]))
    ctx.view_requirements = {"prev_actions": {"shift": -1}, "prev_rewards": {"shift": -1}}
    conn, _ = bound(ViewRequirementAgentConnector(ctx))
    obs = [np.zeros(3)] * 2
    rows = conn(make_rows(obs, keys=[0, 1], is_first=[True, True], rewards=[0, 0]))
    np.testing.assert_array_equal(rows["prev_actions"], [[0, 0], [0, 0]])
    np.testing.assert_array_equal(rows["prev_rewards"], [0, 0])
    conn.on_policy_output(policy_output([0, 1], [[1, 2], [2, 1]]))
    rows = conn(make_rows(obs, keys=[0, 1], is_first=[False, True], rewards=[0.5, 9.0]))
    np.testing.assert_array_equal(rows["prev_actions"], [[1, 2], [0, 0]])  # key 1 restarted
    np.testing.assert_array_equal(rows["prev_rewards"], [0.5, 0.0])
    assert rows["prev_rewards"].dtype == np.float32


def test_frame_stacking_zero_pads_and_resets_at_episode_start():
    space = gym.spaces.Box(1.0, 9.0, (2,), np.float32)
    ctx = ctx_for(space, view_requirements={"obs": {"frames": 3}})
    conn, out_space = bound(ViewRequirementAgentConnector(ctx))
    assert out_space.shape == (3, 2)
    assert out_space.low.min() == 0.0  # zero padding is inside the space
    assert out_space.high.max() == 9.0

    def step(values, keys, is_first):
        obs = [np.full(2, v, np.float32) for v in values]
        return conn(make_rows(obs, keys=keys, is_first=is_first))["obs"][:, :, 0]

    np.testing.assert_array_equal(step([1, 5], [0, 1], [True, True]), [[0, 0, 1], [0, 0, 5]])
    np.testing.assert_array_equal(step([2], [0], [False]), [[0, 1, 2]])
    np.testing.assert_array_equal(step([3, 6], [0, 1], [False, False]), [[1, 2, 3], [0, 5, 6]])
    np.testing.assert_array_equal(step([4], [0], [False]), [[2, 3, 4]])
    # key 0 is recycled for a new episode
    np.testing.assert_array_equal(step([7, 7], [0, 1], [True, False]), [[0, 0, 7], [5, 6, 7]])


def test_frame_stacking_needs_a_box():
    space = gym.spaces.Discrete(3)
    conn = ViewRequirementAgentConnector(ctx_for(space, view_requirements={"obs": {"frames": 2}}))
    with pytest.raises(ConnectorError, match="Box"):
        conn.bind_input_space(space)
    bad = ViewRequirementAgentConnector(ctx_for(FLAT, view_requirements={"obs": {"frames": 0}}))
    with pytest.raises(ConnectorError, match="frames"):
        bad.bind_input_space(FLAT)


# --- LambdaAgentConnector --------------------------------------------------


def scale_obs(item: AgentConnectorDataType) -> AgentConnectorDataType:
    item.data["new_obs"] = item.data["new_obs"] * 2
    return item


def test_lambda_agent_connector():
    conn = LambdaAgentConnector(ctx_for(FLAT), scale_obs)
    rows = conn(make_rows(np.ones((2, 3), np.float32)))
    np.testing.assert_array_equal(rows["obs"], np.full((2, 3), 2.0))
    assert conn.to_state() == (
        "LambdaAgentConnector",
        {"fn": "test_connectors_agent:scale_obs"},
    )
    name, params = conn.to_state()
    rebuilt = get_connector(name, ctx_for(FLAT), params)
    assert rebuilt.fn is scale_obs


def test_lambda_agent_connector_can_drop_rows():
    conn = LambdaAgentConnector(ctx_for(FLAT), "helpers_connectors:drop_agent_b")
    rows = conn(make_rows(np.ones((3, 3)), agent_ids=["a", "b", "c"], keys=[4, 5, 6]))
    assert rows["agent_ids"] == ["a", "c"]
    np.testing.assert_array_equal(rows["keys"], [4, 6])


def test_lambda_that_cannot_be_serialised_says_how_to_fix_it():
    conn = LambdaAgentConnector(ctx_for(FLAT), lambda item: item)
    with pytest.raises(ConnectorError, match="register_lambda_agent_connector"):
        conn.to_state()


def test_registered_lambda_agent_connector():
    cls = register_lambda_agent_connector("DoubleObsTest", scale_obs)
    conn = cls(ctx_for(FLAT))
    assert conn.to_state() == ("DoubleObsTest", {})
    rebuilt = get_connector("DoubleObsTest", ctx_for(FLAT), {})
    rows = rebuilt(make_rows(np.ones((1, 3))))
    np.testing.assert_array_equal(rows["obs"], [[2, 2, 2]])
