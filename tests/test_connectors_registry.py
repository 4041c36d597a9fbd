"""Registry, spec lists as written in YAML, default chains, serialisation."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import yaml
from helpers_connectors import AddToObs, make_rows

import connectors
from connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ClipActionsConnector,
    ClipRewardAgentConnector,
    ConnectorContext,
    ConnectorError,
    ConvertToNumpyConnector,
    NormalizeActionsConnector,
    ObsPreprocessorConnector,
    StateBufferConnector,
    ViewRequirementAgentConnector,
    build_pipeline,
    default_action_connectors,
    default_agent_connectors,
    get_connector,
    register_connector,
    registered_names,
)
from connectors.imports import import_object
from connectors.registry import check_spec_list, overrides_from_state

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


@pytest.fixture
def ctx() -> ConnectorContext:
    return ConnectorContext(BOX, ACTIONS)


BUILTINS = [
    "ObsPreprocessorConnector",
    "FlattenDataAgentConnector",
    "ClipRewardAgentConnector",
    "MeanStdObservationFilterAgentConnector",
    "StateBufferConnector",
    "ViewRequirementAgentConnector",
    "LambdaAgentConnector",
    "ConvertToNumpyConnector",
    "NormalizeActionsConnector",
    "ClipActionsConnector",
    "ImmutableActionsConnector",
    "LambdaActionConnector",
]


def test_every_builtin_is_registered_under_its_class_name():
    for name in BUILTINS:
        assert name in registered_names()
        assert getattr(connectors, name).__name__ == name


@pytest.mark.parametrize("name", [n for n in BUILTINS if not n.startswith("Lambda")])
def test_every_builtin_round_trips_through_json(name, ctx):
    connector = get_connector(name, ctx, {})
    state = json.loads(json.dumps(connector.to_state()))
    assert state[0] == name
    rebuilt = get_connector(state[0], ctx, state[1])
    assert type(rebuilt) is type(connector) and rebuilt.to_state() == connector.to_state()


def test_unknown_name_lists_the_registered_ones(ctx):
    with pytest.raises(ConnectorError, match=r"unknown connector 'NoSuch'.*ClipActionsConnector"):
        get_connector("NoSuch", ctx, {})


def test_bad_params_name_the_connector(ctx):
    with pytest.raises(ConnectorError, match=r"ClipRewardAgentConnector.*limt.*sign"):
        get_connector("ClipRewardAgentConnector", ctx, {"limt": 1.0})
    with pytest.raises(ConnectorError, match="mapping"):
        get_connector("ClipRewardAgentConnector", ctx, [1.0])


def test_import_paths(ctx):
    connector = get_connector("helpers_connectors:AddToObs", ctx, {"amount": 3.0})
    assert isinstance(connector, AddToObs) and connector.amount == 3.0
    # an unregistered user class serialises by its import path
    assert connector.to_state() == ("helpers_connectors:AddToObs", {"amount": 3.0})
    with pytest.raises(ConnectorError, match="no_such_module"):
        get_connector("no_such_module:Thing", ctx, {})
    with pytest.raises(ConnectorError, match="not a Connector"):
        get_connector("helpers_connectors:make_rows", ctx, {})


def test_register_connector(ctx):
    class Renamed(AddToObs):
        pass

    register_connector("MyAddTest", Renamed)
    connector = get_connector("MyAddTest", ctx, {"amount": 2.0})
    assert connector.to_state() == ("MyAddTest", {"amount": 2.0})
    with pytest.raises(ConnectorError, match="Connector subclass"):
        register_connector("Bad", dict)  # type: ignore[arg-type]
    with pytest.raises(ConnectorError, match="non-empty"):
        register_connector("", Renamed)


YAML_SPEC = """
agent_connectors:
  - ObsPreprocessorConnector
  - {name: ClipRewardAgentConnector, limit: 1.0}
  - name: MeanStdObservationFilterAgentConnector
    clip: 5.0
  - {name: "helpers_connectors:AddToObs", amount: 0.5}
action_connectors:
  - ConvertToNumpyConnector
  - ClipActionsConnector
"""


def test_yaml_style_spec_lists(ctx):
    spec = yaml.safe_load(YAML_SPEC)
    agent = build_pipeline(spec["agent_connectors"], ctx, kind="agent")
    action = build_pipeline(spec["action_connectors"], ctx, kind="action")
    assert isinstance(agent, AgentConnectorPipeline) and isinstance(action, ActionConnectorPipeline)
    assert [type(c).__name__ for c in agent] == [
        "ObsPreprocessorConnector",
        "ClipRewardAgentConnector",
        "MeanStdObservationFilterAgentConnector",
        "AddToObs",
    ]
    assert agent["ClipRewardAgentConnector"].limit == 1.0
    assert agent["MeanStdObservationFilterAgentConnector"].clip == 5.0
    rows = agent(make_rows([np.zeros(3, np.float32)], rewards=[4.0]))
    assert rows["rewards"][0] == 1.0 and rows["obs"].shape == (1, 3)
    assert [type(c) for c in action] == [ConvertToNumpyConnector, ClipActionsConnector]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (["ObsPreprocessorConnector", 42], r"spec #1 is 42: expected a connector name"),
        ([{"limit": 1.0}], r"spec #0 .*expected .*name"),
        (["ObsPreprocessorConnector", "Nope"], r"spec #1: unknown connector 'Nope'"),
        (["ConvertToNumpyConnector"], r"spec #0 is ConvertToNumpyConnector, an action connector, not an AgentConnector"),
        ("ObsPreprocessorConnector", "must be given as a list"),
    ],
)
def test_malformed_specs(spec, match, ctx):
    with pytest.raises(ConnectorError, match=match):
        build_pipeline(spec, ctx, kind="agent")


def test_bad_kind(ctx):
    with pytest.raises(ConnectorError, match="kind"):
        build_pipeline([], ctx, kind="policy")  # type: ignore[arg-type]


def test_space_errors_surface_from_build_pipeline():
    ctx = ConnectorContext(gym.spaces.Dict({"a": BOX}), ACTIONS)
    with pytest.raises(ConnectorError, match="MeanStdObservationFilterAgentConnector"):
        build_pipeline(["MeanStdObservationFilterAgentConnector"], ctx)


def test_defaults(ctx):
    assert [type(c) for c in default_agent_connectors(ctx)] == [
        ObsPreprocessorConnector,
        StateBufferConnector,
        ViewRequirementAgentConnector,
    ]
    assert [type(c) for c in default_action_connectors(ctx)] == [
        ConvertToNumpyConnector,
        ClipActionsConnector,
    ]
    ctx.config["normalize_actions"] = True
    assert type(default_action_connectors(ctx)[1]) is NormalizeActionsConnector
    # None means "use the defaults", [] an empty chain
    assert len(build_pipeline(None, ctx, kind="action")) == 2
    assert len(build_pipeline([], ctx, kind="agent")) == 0


def test_spec_items_may_be_pairs_or_connectors(ctx):
    pipeline = build_pipeline(
        [("ClipRewardAgentConnector", {"sign": True}), StateBufferConnector(ctx)], ctx
    )
    assert pipeline[0].sign and isinstance(pipeline[1], StateBufferConnector)


def test_context_from_policy():
    class FakePolicy:
        observation_space = BOX
        action_space = ACTIONS
        view_requirements = {"prev_rewards": {}}
        config = {"normalize_actions": True}

        def get_initial_state(self):
            return [np.zeros(4)]

    ctx = ConnectorContext.from_policy(FakePolicy())
    assert ctx.observation_space is BOX and ctx.view_requirements == {"prev_rewards": {}}
    assert len(ctx.initial_states) == 1 and ctx.config["normalize_actions"]
    original = gym.spaces.Dict({"x": BOX})
    assert ConnectorContext.from_policy(FakePolicy(), original).observation_space is original
    assert ConnectorContext(BOX, ACTIONS).config == {}


FROM_STATE_FORMS = ["ScaleRewards", "StaticScaleRewards", "ClassScaleRewards"]


@pytest.mark.parametrize("cls_name", FROM_STATE_FORMS)
def test_from_state_may_be_static_class_or_inherited(cls_name, ctx):
    """Issue 17.11: a staticmethod from_state crashed check_params (no __func__)."""
    path = f"helpers_from_state_connectors:{cls_name}"
    register_connector(f"Registered{cls_name}", import_object(path))
    try:
        for name in (path, f"Registered{cls_name}"):
            assert check_spec_list([{"name": name, "factor": 2.0}], "agent") == "agent"
            pipeline = build_pipeline([{"name": name, "factor": 2.0}], ctx, kind="agent")
            rows = pipeline(make_rows([np.zeros(3, np.float32)], rewards=[1.5]))
            assert rows["rewards"][0] == 3.0
            state_name, params = pipeline[0].to_state()
            rebuilt = get_connector(state_name, ctx, params)
            assert type(rebuilt) is type(pipeline[0]) and rebuilt.factor == 2.0
    finally:  # the class serialises by its import path again, as other tests expect
        del import_object(path)._registry_name


def test_overridden_from_state_decides_its_parameters(ctx):
    """Only a class that overrides from_state may take names its constructor does not."""
    for name in ("StaticScaleRewards", "ClassScaleRewards"):
        connector = get_connector(f"helpers_from_state_connectors:{name}", ctx, {"scale": 4.0})
        assert connector.factor == 4.0
    with pytest.raises(ConnectorError, match=r"unknown parameter 'scale'.*'factor'"):
        get_connector("helpers_from_state_connectors:ScaleRewards", ctx, {"scale": 4.0})
    assert not overrides_from_state(ClipRewardAgentConnector)
    assert overrides_from_state(import_object("helpers_from_state_connectors:StaticScaleRewards"))


@pytest.mark.parametrize("cls_name", FROM_STATE_FORMS)
def test_from_state_forms_load_from_yaml_and_sample(cls_name, tmp_path):
    """Each form through a YAML config, its import check, and a runner over tic-tac-toe."""
    from marl_runner import EnvRunner, RunnerConfig

    chain = f"[ObsPreprocessorConnector, {{name: 'helpers_from_state_connectors:{cls_name}', factor: 10.0}}]"
    path = tmp_path / "config.yaml"
    path.write_text(
        "env: {name: 'pettingzoo.classic.tictactoe_v3:env', api: aec}\n"
        "rollout_fragment_length: 20\n"
        f"policies:\n  shared:\n    agent_connectors: {chain}\n",
        encoding="utf-8",
    )
    config = RunnerConfig.from_yaml(path)
    config.check_imports()
    with EnvRunner(config) as runner:
        batch = runner.sample()
    rewards = batch.policy_batches["shared"]["rewards"]
    assert set(np.unique(rewards)) <= {-10.0, 0.0, 10.0}


def test_one_list_of_builtins_registered_and_exported():
    """The built-ins are listed once (the built-in packages' exports); all are registered."""
    from connectors.registry import BUILTIN_CONNECTORS

    names = {cls.__name__ for cls in BUILTIN_CONNECTORS}
    assert names == set(BUILTINS) | {
        "GrayscaleAgentConnector", "ResizeAgentConnector", "EnvStateAgentConnector"
    }
    for cls in BUILTIN_CONNECTORS:
        assert getattr(connectors, cls.__name__) is cls and cls.__name__ in connectors.__all__
        assert cls.registry_name() == cls.__name__
