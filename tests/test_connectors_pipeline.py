"""Pipelines: chain edits, lookups, space checks, timings, modes, state."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from helpers_connectors import AddToObs, make_rows
from pettingzoo.classic import tictactoe_v3

from connectors import (
    ActionConnectorPipeline,
    ActionRows,
    AgentConnector,
    AgentConnectorPipeline,
    ClipActionsConnector,
    ClipRewardAgentConnector,
    ConnectorContext,
    ConnectorError,
    ConnectorTiming,
    ConvertToNumpyConnector,
    FlattenDataAgentConnector,
    ImmutableActionsConnector,
    MeanStdObservationFilterAgentConnector,
    ObsPreprocessorConnector,
    StateBufferConnector,
    ViewRequirementAgentConnector,
)

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


@pytest.fixture
def ctx() -> ConnectorContext:
    return ConnectorContext(BOX, ACTIONS)


@pytest.fixture
def tictactoe_ctx() -> ConnectorContext:
    env = tictactoe_v3.env()
    return ConnectorContext(env.observation_space("player_1"), env.action_space("player_1"))


def names(pipeline) -> list[str]:
    return [type(c).__name__ for c in pipeline]


def test_chain_edits_and_lookups(ctx):
    pipeline = AgentConnectorPipeline(ctx, [ObsPreprocessorConnector(ctx)])
    pipeline.append(StateBufferConnector(ctx))
    pipeline.prepend(ClipRewardAgentConnector(ctx, limit=1.0))
    pipeline.insert_before("StateBufferConnector", AddToObs(ctx))
    pipeline.insert_after(ObsPreprocessorConnector, ViewRequirementAgentConnector(ctx))
    assert names(pipeline) == [
        "ClipRewardAgentConnector",
        "ObsPreprocessorConnector",
        "ViewRequirementAgentConnector",
        "AddToObs",
        "StateBufferConnector",
    ]
    assert len(pipeline) == 5
    assert isinstance(pipeline[0], ClipRewardAgentConnector)
    assert isinstance(pipeline[-1], StateBufferConnector)
    assert pipeline["AddToObs"] is pipeline[3]
    assert pipeline[AddToObs] is pipeline[3]
    assert pipeline["helpers_connectors:AddToObs"] is pipeline[3]  # the registry-style name
    assert [type(c) for c in pipeline[1:3]] == [
        ObsPreprocessorConnector,
        ViewRequirementAgentConnector,
    ]
    assert "AddToObs" in pipeline and "Nothing" not in pipeline
    removed = pipeline.remove(AddToObs)
    assert isinstance(removed, AddToObs) and "AddToObs" not in pipeline


def test_missing_names_raise_key_error_listing_the_chain(ctx):
    pipeline = AgentConnectorPipeline(ctx, [ObsPreprocessorConnector(ctx)])
    for op in (
        lambda: pipeline["Nope"],
        lambda: pipeline.remove("Nope"),
        lambda: pipeline.insert_before("Nope", StateBufferConnector(ctx)),
        lambda: pipeline.insert_after("Nope", StateBufferConnector(ctx)),
    ):
        with pytest.raises(KeyError, match=r"'Nope'.*\['ObsPreprocessorConnector'\]"):
            op()
    with pytest.raises(KeyError, match="FlattenDataAgentConnector"):
        pipeline.remove(FlattenDataAgentConnector)
    assert len(pipeline) == 1


def test_wrong_connector_kind_is_rejected(ctx):
    with pytest.raises(ConnectorError, match="AgentConnector"):
        AgentConnectorPipeline(ctx, [ConvertToNumpyConnector(ctx)])
    with pytest.raises(ConnectorError, match="ActionConnector"):
        ActionConnectorPipeline(ctx, [StateBufferConnector(ctx)])


def test_output_space_is_folded_and_recomputed(tictactoe_ctx):
    ctx = tictactoe_ctx
    ctx.view_requirements = {"obs": {"frames": 4}}
    pipeline = AgentConnectorPipeline(ctx, [ObsPreprocessorConnector(ctx)])
    assert pipeline.output_observation_space.shape == (18,)
    pipeline.append(ViewRequirementAgentConnector(ctx))
    assert pipeline.output_observation_space.shape == (4, 18)
    pipeline.append(FlattenDataAgentConnector(ctx))
    assert pipeline.output_observation_space.shape == (72,)
    pipeline.remove(ViewRequirementAgentConnector)
    assert pipeline.output_observation_space.shape == (18,)


def test_chain_that_does_not_fit_fails_when_built(tictactoe_ctx):
    ctx = tictactoe_ctx
    with pytest.raises(ConnectorError) as err:
        AgentConnectorPipeline(ctx, [MeanStdObservationFilterAgentConnector(ctx)])
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "MeanStdObservationFilterAgentConnector" in message
    assert "Dict(" in message and "env's observation space" in message


def tictactoe_env_obs():
    env = tictactoe_v3.env()
    env.reset(seed=0)
    return env.observe("player_1")


class BrokenSpaceConnector(AgentConnector):
    def output_observation_space(self, space):
        raise ConnectorError(f"BrokenSpaceConnector cannot take {space}")


def test_failed_edits_leave_the_chain_unchanged(tictactoe_ctx):
    ctx = tictactoe_ctx
    pipeline = AgentConnectorPipeline(
        ctx, [ObsPreprocessorConnector(ctx), MeanStdObservationFilterAgentConnector(ctx)]
    )
    before = names(pipeline)
    with pytest.raises(ConnectorError, match="MeanStdObservationFilterAgentConnector.*Dict"):
        pipeline.remove(ObsPreprocessorConnector)
    with pytest.raises(ConnectorError, match="MeanStdObservationFilterAgentConnector.*Dict"):
        pipeline.insert_before(
            ObsPreprocessorConnector, MeanStdObservationFilterAgentConnector(ctx)
        )
    with pytest.raises(ConnectorError, match="BrokenSpaceConnector.*comes from ObsPreprocessor"):
        pipeline.insert_after(ObsPreprocessorConnector, BrokenSpaceConnector(ctx))
    assert names(pipeline) == before
    assert pipeline.output_observation_space.shape == (18,)
    rows = pipeline(make_rows([tictactoe_env_obs()] * 3))
    assert rows["obs"].shape == (3, 18) and rows["action_mask"].shape == (3, 9)


def test_user_connector_runs_per_item(ctx):
    pipeline = AgentConnectorPipeline(
        ctx, [ObsPreprocessorConnector(ctx), AddToObs(ctx, amount=2.0)]
    )
    rows = pipeline(make_rows([np.zeros(3, np.float32)] * 2))
    np.testing.assert_array_equal(rows["obs"], np.full((2, 3), 2.0))


def test_timings_are_read_and_reset(ctx):
    pipeline = AgentConnectorPipeline(
        ctx, [ObsPreprocessorConnector(ctx), StateBufferConnector(ctx)]
    )
    for _ in range(3):
        pipeline(make_rows([np.zeros(3, np.float32)] * 4))
    assert set(pipeline.timings) == {"ObsPreprocessorConnector", "StateBufferConnector"}
    timings = pipeline.pop_timings()
    assert set(timings) == {"ObsPreprocessorConnector", "StateBufferConnector"}
    assert timings["ObsPreprocessorConnector"]["calls"] == 3
    for timing in timings.values():
        assert set(timing) == {"mean_ms", "total_ms", "calls"}
        assert timing["total_ms"] >= 0.0 and timing["mean_ms"] >= 0.0
        assert timing["mean_ms"] == pytest.approx(timing["total_ms"] / timing["calls"])
    assert json.loads(json.dumps(timings)) == timings  # plain data, for get_metrics()
    assert pipeline.pop_timings() == {} and pipeline.timings == {}
    pipeline(make_rows([np.zeros(3, np.float32)]))
    records = pipeline.pop_timing_records()
    assert isinstance(records["StateBufferConnector"], ConnectorTiming)
    assert records["StateBufferConnector"].calls == 1


def test_repeated_connector_classes_are_timed_apart(ctx):
    pipeline = AgentConnectorPipeline(
        ctx,
        [
            ClipRewardAgentConnector(ctx, limit=2.0),
            ObsPreprocessorConnector(ctx),
            ClipRewardAgentConnector(ctx, limit=1.0),
        ],
    )
    pipeline(make_rows([np.zeros(3, np.float32)]))
    timings = pipeline.pop_timings()
    assert set(timings) == {
        "ClipRewardAgentConnector",
        "ObsPreprocessorConnector",
        "ClipRewardAgentConnector#2",
    }
    assert all(t["calls"] == 1 for t in timings.values())


def test_modes_propagate_to_present_and_added_connectors(ctx):
    filt = MeanStdObservationFilterAgentConnector(ctx)
    pipeline = AgentConnectorPipeline(ctx, [filt])
    pipeline.in_eval()
    assert not pipeline.is_training and not filt.is_training
    added = ClipRewardAgentConnector(ctx)
    pipeline.append(added)
    assert not added.is_training
    pipeline(make_rows([np.ones(3, np.float32)]))
    assert filt.get_state()["count"] == 0  # frozen
    pipeline.in_training()
    assert filt.is_training and added.is_training


def test_reset_and_on_policy_output_reach_every_connector(ctx):
    seen = []

    class Recorder(AgentConnector):
        def __call__(self, rows):
            return rows

        def reset(self, env_id):
            seen.append(("reset", env_id))

        def on_policy_output(self, output):
            seen.append(("output", len(output)))

    pipeline = AgentConnectorPipeline(ctx, [Recorder(ctx), Recorder(ctx)])
    pipeline.reset(3)
    out = ActionRows(
        actions=np.zeros((2, 2)), keys=np.arange(2), env_ids=np.zeros(2), agent_ids=["a", "b"]
    )
    pipeline.on_policy_output(out)
    assert seen == [("reset", 3), ("reset", 3), ("output", 2), ("output", 2)]


def test_repr_lists_the_chain(ctx):
    pipeline = AgentConnectorPipeline(ctx, [ClipRewardAgentConnector(ctx, limit=2.0)])
    assert "ClipRewardAgentConnector(sign=False, limit=2.0)" in repr(pipeline)
    assert repr(ActionConnectorPipeline(ctx)) == "ActionConnectorPipeline([])"


def test_state_round_trip(ctx):
    pipeline = AgentConnectorPipeline(
        ctx,
        [
            ObsPreprocessorConnector(ctx),
            ClipRewardAgentConnector(ctx, sign=True),
            MeanStdObservationFilterAgentConnector(ctx, clip=3.0),
            AddToObs(ctx, amount=0.5),
        ],
    )
    pipeline(make_rows(list(np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32))))
    state = json.loads(json.dumps(pipeline.to_state()))
    rebuilt = AgentConnectorPipeline.from_state(ctx, state)
    assert names(rebuilt) == names(pipeline)
    assert json.loads(json.dumps(rebuilt.to_state())) == state
    assert (
        rebuilt[MeanStdObservationFilterAgentConnector].get_state()
        == pipeline[MeanStdObservationFilterAgentConnector].get_state()
    )
    assert rebuilt["AddToObs"].amount == 0.5


def test_action_pipeline(ctx):
    pipeline = ActionConnectorPipeline(
        ctx,
        [ConvertToNumpyConnector(ctx), ClipActionsConnector(ctx), ImmutableActionsConnector(ctx)],
    )
    raw = np.array([[3.0, -0.5]], np.float32)
    out = pipeline(ActionRows(actions=raw, keys=np.arange(1), env_ids=np.zeros(1), agent_ids=["a"]))
    np.testing.assert_array_equal(out.actions, [[1.0, -0.5]])
    assert not out.actions.flags.writeable
    np.testing.assert_array_equal(raw, [[3.0, -0.5]])  # the raw output is kept for the trajectory
    assert set(pipeline.pop_timings()) == {
        "ConvertToNumpyConnector",
        "ClipActionsConnector",
        "ImmutableActionsConnector",
    }
    rebuilt = ActionConnectorPipeline.from_state(ctx, pipeline.to_state())
    assert names(rebuilt) == names(pipeline)


def test_view_requirements_changed_after_build_need_refresh_spaces(ctx):
    pipeline = AgentConnectorPipeline(ctx, [ViewRequirementAgentConnector(ctx)])
    assert pipeline.output_observation_space == BOX
    ctx.view_requirements = {"prev_rewards": {}}  # no space change: picked up lazily
    rows = pipeline(make_rows([np.zeros(3, np.float32)], rewards=[2.0]))
    assert rows["prev_rewards"][0] == 2.0
    ctx.view_requirements = {"obs": {"frames": 2}}
    with pytest.raises(ConnectorError, match="refresh_spaces"):
        pipeline(make_rows([np.zeros(3, np.float32)]))
    pipeline.refresh_spaces()
    assert pipeline.output_observation_space.shape == (2, 3)
    rows = pipeline(make_rows([np.ones(3, np.float32)], is_first=[True]))
    np.testing.assert_array_equal(rows["obs"], [[[0, 0, 0], [1, 1, 1]]])


def _filter_rows(values, keys=(0, 1)):
    return make_rows(np.asarray(values, np.float32), keys=list(keys), is_first=[False] * len(keys))


def test_set_state_updates_in_place_and_keeps_per_trajectory_state(ctx):
    ctx.initial_states = [np.zeros(2, np.float32)]
    source = AgentConnectorPipeline(
        ctx, [ObsPreprocessorConnector(ctx), MeanStdObservationFilterAgentConnector(ctx)]
    )
    source(_filter_rows([[1, 2, 3], [3, 4, 5]]))
    target = AgentConnectorPipeline(
        ctx,
        [
            ObsPreprocessorConnector(ctx),
            MeanStdObservationFilterAgentConnector(ctx),
            StateBufferConnector(ctx),
        ],
    )
    target.in_eval()
    target(_filter_rows([[0, 0, 0], [0, 0, 0]]))
    buffer = target[StateBufferConnector]
    buffer.on_policy_output(
        ActionRows(
            actions=np.zeros((2, 2)), state_outs=[np.array([[1, 1], [2, 2]], np.float32)],
            keys=np.arange(2), env_ids=np.zeros(2, np.int64), agent_ids=["a", "b"],
        )
    )
    connectors_before = list(target)
    state = [*source.to_state(), ("StateBufferConnector", {})]
    target.set_state(json.loads(json.dumps(state)))  # also from JSON (pairs become lists)
    assert list(target) == connectors_before  # same objects: nothing rebuilt
    assert not target.is_training and not target[1].is_training
    assert target[1].get_state() == source[1].get_state()
    rows = target(_filter_rows([[2, 3, 4], [2, 3, 4]]))
    np.testing.assert_array_equal(rows["state_in_0"], [[1, 1], [2, 2]])  # RNN states kept
    np.testing.assert_allclose(rows["obs"], 0.0, atol=1e-6)  # normalised with the new stats
    assert target[1].get_state() == source[1].get_state()  # eval: stats frozen


def test_set_state_rebuilds_what_differs(ctx):
    pipeline = AgentConnectorPipeline(
        ctx, [ClipRewardAgentConnector(ctx, limit=1.0), ObsPreprocessorConnector(ctx)]
    )
    pipeline.in_eval()
    clip, preprocessor = list(pipeline)
    pipeline.set_state([("ClipRewardAgentConnector", {"limit": 0.5}), "ObsPreprocessorConnector"])
    assert pipeline[0] is not clip and pipeline[0].limit == 0.5
    assert pipeline[1] is preprocessor
    assert not pipeline[0].is_training  # rebuilt connectors follow the pipeline's mode
    pipeline.set_state([("StateBufferConnector", {})])  # another chain: rebuilt whole
    assert names(pipeline) == ["StateBufferConnector"] and not pipeline[0].is_training


def test_failed_set_state_changes_nothing(ctx):
    pipeline = AgentConnectorPipeline(
        ctx, [ObsPreprocessorConnector(ctx), MeanStdObservationFilterAgentConnector(ctx)]
    )
    pipeline(_filter_rows([[1, 2, 3], [3, 4, 5]]))
    before = pipeline.to_state()
    with pytest.raises(ConnectorError, match="limit"):
        pipeline.set_state([("ClipRewardAgentConnector", {"limit": -1.0})])
    with pytest.raises(ConnectorError):
        pipeline.set_state(
            [
                ("ObsPreprocessorConnector", {"masks_from_infos": False}),
                ("MeanStdObservationFilterAgentConnector", {"state": {"count": 1}}),
            ]
        )
    with pytest.raises(ConnectorError, match="must be a list"):
        pipeline.set_state("ObsPreprocessorConnector")
    assert pipeline.to_state() == before
