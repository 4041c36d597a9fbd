"""The connector contract (issue 8, defect 4 and redesign 7).

- ``build_pipeline`` reads agent vs action from the classes; mixing kinds is an error.
- Pipelines take items as well as columns, and return what they were given.
- A per-item connector sees the documented keys; bookkeeping survives the round trip.
- Build errors say where: ``.index`` in the spec list, ``.param`` for a parameter.
- Action connectors declare the space they take; with ``NormalizeActionsConnector``
  the policy acts in Box(-1, 1) and a random policy covers the env's whole Box.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from helpers_connectors import SEEN_ITEMS, make_rows

from connectors import (
    ActionConnectorDataType,
    ActionConnectorPipeline,
    AgentConnectorDataType,
    AgentConnectorPipeline,
    AgentRows,
    ConnectorContext,
    ConnectorError,
    build_pipeline,
    get_connector,
)
from marl_runner import EnvRunner, RunnerConfig

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ENV_ACTIONS = gym.spaces.Box(0.0, 10.0, (2,), np.float32)
SPEC_KEYS = {
    "t",
    "env_id",
    "agent_index",
    "rewards",
    "terminateds",
    "truncateds",
    "infos",
    "new_obs",
}


@pytest.fixture
def ctx() -> ConnectorContext:
    return ConnectorContext(OBS, ENV_ACTIONS)


# ----------------------------------------------------------------------------- kinds


def test_action_chain_needs_no_kind(ctx: ConnectorContext) -> None:
    """Regression: action names failed unless kind="action" was given."""
    pipeline = build_pipeline(["ConvertToNumpyConnector", "ClipActionsConnector"], ctx)
    assert isinstance(pipeline, ActionConnectorPipeline) and len(pipeline) == 2
    agent = build_pipeline(["ObsPreprocessorConnector", "StateBufferConnector"], ctx)
    assert isinstance(agent, AgentConnectorPipeline)


def test_kind_stays_an_optional_check(ctx: ConnectorContext) -> None:
    assert isinstance(
        build_pipeline(["ClipActionsConnector"], ctx, kind="action"), ActionConnectorPipeline
    )
    with pytest.raises(ConnectorError, match="belongs in the action chain") as info:
        build_pipeline(["ObsPreprocessorConnector", "ClipActionsConnector"], ctx, kind="agent")
    assert info.value.index == 1


def test_mixing_kinds_names_the_item(ctx: ConnectorContext) -> None:
    with pytest.raises(ConnectorError) as info:
        build_pipeline(
            ["ObsPreprocessorConnector", "ClipRewardAgentConnector", "ClipActionsConnector"], ctx
        )
    assert info.value.index == 2 and info.value.param is None
    message = str(info.value)
    assert "#2 is ClipActionsConnector, an action connector" in message
    assert "#0 (ObsPreprocessorConnector) is an agent connector" in message


def test_default_chain_needs_a_kind(ctx: ConnectorContext) -> None:
    with pytest.raises(ConnectorError, match="kind='agent' or kind='action'"):
        build_pipeline(None, ctx)


# ----------------------------------------------------------------------------- where errors come from


@pytest.mark.parametrize(
    ("spec", "index", "param", "words"),
    [
        ([{"name": "ClipRewardAgentConnector", "limt": 1}], 0, "limt", ["did you mean 'limit'"]),
        (
            ["ObsPreprocessorConnector", {"name": "ClipRewardAgentConnector", "limit": "abc"}],
            1,
            "limit",
            ["'abc'", "a number or null"],
        ),
        ([{"name": "ClipRewardAgentConnector", "limit": 0}], 0, "limit", ["> 0"]),
        (
            [{"name": "LambdaAgentConnector", "fn": "no_such_mod_xyz:f"}],
            0,
            "fn",
            ["no module named 'no_such_mod_xyz'"],
        ),
        (
            ["StateBufferConnector", "no_such_mod_xyz:Conn"],
            1,
            None,
            ["no module named 'no_such_mod_xyz'"],
        ),
        (["helpers_connectors:NoSuchConnector"], 0, None, ["has no attribute 'NoSuchConnector'"]),
        (["helpers_connectors:make_rows"], 0, None, ["not a Connector subclass"]),
        (["ClipRewardAgentConnectr"], 0, None, ["did you mean 'ClipRewardAgentConnector'"]),
        (["StateBufferConnector", 7], 1, None, ["expected a connector name"]),
    ],
)
def test_build_errors_carry_index_and_param(
    ctx: ConnectorContext, spec: list, index: int, param: str | None, words: list[str]
) -> None:
    with pytest.raises(ConnectorError) as info:
        build_pipeline(spec, ctx)
    assert (info.value.index, info.value.param) == (index, param)
    for word in words:
        assert word in str(info.value)


def test_space_errors_carry_the_index() -> None:
    ctx = ConnectorContext(gym.spaces.Discrete(3), ENV_ACTIONS)
    with pytest.raises(ConnectorError, match="needs a Box") as info:
        build_pipeline(["ClipRewardAgentConnector", "MeanStdObservationFilterAgentConnector"], ctx)
    assert info.value.index == 1


def test_get_connector_names_the_param(ctx: ConnectorContext) -> None:
    with pytest.raises(ConnectorError) as info:
        get_connector("MeanStdObservationFilterAgentConnector", ctx, {"clip": "big"})
    assert info.value.param == "clip" and info.value.index is None


# ----------------------------------------------------------------------------- items in, items out


def test_agent_pipeline_takes_and_returns_items(ctx: ConnectorContext) -> None:
    pipeline = build_pipeline([{"name": "ClipRewardAgentConnector", "limit": 1.0}], ctx)
    items = make_rows([np.zeros(3, np.float32)] * 2, rewards=[5.0, -0.5]).to_items()
    out = pipeline(items)
    assert isinstance(out, list) and all(isinstance(i, AgentConnectorDataType) for i in out)
    assert [float(i.data["rewards"]) for i in out] == [1.0, -0.5]
    assert [i.agent_id for i in out] == ["agent_0", "agent_1"]


def test_action_pipeline_takes_and_returns_one_item(ctx: ConnectorContext) -> None:
    pipeline = build_pipeline(["ConvertToNumpyConnector", "NormalizeActionsConnector"], ctx)
    item = ActionConnectorDataType(
        3, "a", {"obs": np.zeros(3)}, (np.array([-1.0, 0.5]), [], {"vf_preds": 0.25})
    )
    out = pipeline(item)
    assert isinstance(out, ActionConnectorDataType)
    assert (out.env_id, out.agent_id) == (3, "a")
    np.testing.assert_allclose(out.output[0], [0.0, 7.5])
    assert out.output[2]["vf_preds"] == 0.25


# ----------------------------------------------------------------------------- the per-item view


def test_item_view_has_spec_keys_and_hides_bookkeeping() -> None:
    rows = make_rows(
        [np.full(3, 0.5, np.float32), np.zeros(3, np.float32)], keys=[7, 9], is_first=[True, False]
    )
    rows["t"] = np.array([0, 4], np.int64)
    rows["agent_index"] = np.array([1, 0], np.int64)
    rows["action_mask"] = np.ones((2, 4), np.int8)
    items = rows.to_items()
    assert set(items[0].data) == SPEC_KEYS | {"action_mask"}
    np.testing.assert_array_equal(items[0].data["new_obs"], rows["obs"][0])
    assert (items[1].data["t"], items[1].data["agent_index"], items[1].data["env_id"]) == (4, 0, 0)
    back = AgentRows.from_items(items, like=rows)
    assert set(back.columns) == set(rows.columns)
    np.testing.assert_array_equal(back["keys"], [7, 9])
    np.testing.assert_array_equal(back["is_first"], [True, False])
    np.testing.assert_array_equal(back["t"], [0, 4])


def test_rows_without_t_and_agent_index_still_make_items() -> None:
    items = make_rows([np.zeros(3, np.float32)]).to_items()
    assert SPEC_KEYS - {"t", "agent_index"} <= set(items[0].data)


def test_added_rows_must_copy_an_item() -> None:
    rows = make_rows([np.zeros(3, np.float32)], keys=[4])
    item = rows.to_items()[0]
    copied = copy.deepcopy(item)
    copied.agent_id = "twin"
    both = AgentRows.from_items([item, copied], like=rows)
    assert both["agent_ids"] == ["agent_0", "twin"]
    np.testing.assert_array_equal(both["keys"], [4, 4])
    made = AgentConnectorDataType(0, "new", dict(item.data))
    with pytest.raises(
        ConnectorError, match=r"item 1 \(agent 'new'\) has no trajectory bookkeeping"
    ):
        AgentRows.from_items([item, made], like=rows)


def test_runner_items_carry_t_and_agent_index() -> None:
    """What a per-item connector sees while sampling: t counts from 0 per agent, agent_index is fixed."""
    SEEN_ITEMS.clear()
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "helpers_connectors:RecordingBoxEnv", "config": {"episode_len": 4}},
            "rollout_fragment_length": 10,
            "policies": {
                "p": {
                    "policy_class": "RandomPolicy",
                    "agent_connectors": [
                        {
                            "name": "LambdaAgentConnector",
                            "fn": "helpers_connectors:record_item_view",
                        },
                        "ObsPreprocessorConnector",
                    ],
                }
            },
        }
    )
    with EnvRunner(config) as runner:
        runner.sample(num_env_steps=10)
    assert SEEN_ITEMS
    last_t: dict[str, int] = {}
    max_t = 0
    for env_id, agent_id, data in SEEN_ITEMS:
        assert SPEC_KEYS <= set(data), set(data)
        assert data["env_id"] == env_id == 0
        assert data["agent_index"] == {"a0": 0, "a1": 1}[agent_id]
        expected_t = 0 if data["t"] == 0 else last_t[agent_id] + 1
        assert data["t"] == expected_t
        last_t[agent_id] = data["t"]
        max_t = max(max_t, data["t"])
    assert max_t == 4  # episodes of 5 obs per agent: t = 0 .. 4


# ----------------------------------------------------------------------------- action spaces


def test_action_chain_derives_the_policy_action_space(ctx: ConnectorContext) -> None:
    clipped = build_pipeline(["ConvertToNumpyConnector", "ClipActionsConnector"], ctx)
    assert clipped.input_action_space == ENV_ACTIONS
    normalized = build_pipeline(["ConvertToNumpyConnector", "NormalizeActionsConnector"], ctx)
    assert normalized.input_action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    normalized.remove("NormalizeActionsConnector")
    assert normalized.input_action_space == ENV_ACTIONS


def test_normalize_keeps_unbounded_dims_and_other_spaces() -> None:
    space = gym.spaces.Dict(
        {
            "move": gym.spaces.Box(
                np.array([0.0, -np.inf], np.float32), np.array([4.0, np.inf], np.float32)
            ),
            "pick": gym.spaces.Discrete(3),
        }
    )
    pipeline = build_pipeline(["NormalizeActionsConnector"], ConnectorContext(OBS, space))
    taken = pipeline.input_action_space
    np.testing.assert_array_equal(taken["move"].low, [-1.0, -np.inf])
    np.testing.assert_array_equal(taken["move"].high, [1.0, np.inf])
    assert taken["pick"] == gym.spaces.Discrete(3)


def test_random_policy_spreads_over_the_env_box_with_normalize_actions() -> None:
    """Regression: the policy acted in the env's Box(0, 10); Normalize clipped that to [-1, 1],
    so ~90% of the actions the env got sat on the upper bound."""
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "helpers_connectors:RecordingBoxEnv"},
            "normalize_actions": True,
            "rollout_fragment_length": 250,
            "policies": {"p": {"policy_class": "RandomPolicy"}},
        }
    )
    with EnvRunner(config) as runner:
        assert runner.get_spaces()["p"][1] == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        runner.sample(num_env_steps=250)
        (env,) = runner.env.get_sub_environments()
        received = np.concatenate([np.asarray(a, np.float64).reshape(1, 2) for a in env.received])
    assert len(received) >= 400
    assert received.min() >= 0.0 and received.max() <= 10.0
    on_bounds = np.mean((received == 0.0) | (received == 10.0))
    assert on_bounds < 0.01, f"{on_bounds:.0%} of the actions sit on the Box's bounds"
    np.testing.assert_allclose(np.percentile(received, [10, 50, 90]), [1.0, 5.0, 9.0], atol=0.8)
    counts, _ = np.histogram(received, bins=5, range=(0.0, 10.0))
    assert counts.min() > 0.6 * counts.mean(), counts
