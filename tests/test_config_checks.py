"""What ``RunnerConfig.from_dict`` checks without an env (issue 8, defect 5).

Connector names, parameter names and types, the kind of each connector in
each chain, and model keys per model type: each a ``ConfigError`` naming the
dotted key. ``check_imports`` adds connectors named by import path.
"""

from __future__ import annotations

from typing import Any

import pytest

from marl_runner.config import ConfigError, RunnerConfig


def config_with(**policy: Any) -> dict[str, Any]:
    return {"env": {"name": "pkg.envs:make"}, "policies": {"p": policy}}


@pytest.mark.parametrize(
    ("policy", "key", "words"),
    [
        (
            {"agent_connectors": [{"name": "ClipRewardAgentConnector", "limt": 1.0}]},
            "policies.p.agent_connectors[0].limt",
            ["unknown parameter 'limt'", "did you mean 'limit'", "'sign', 'limit'"],
        ),
        (
            {
                "agent_connectors": [
                    "ObsPreprocessorConnector",
                    {"name": "ClipRewardAgentConnector", "limit": "abc"},
                ]
            },
            "policies.p.agent_connectors[1].limit",
            ["got 'abc'", "a number or null"],
        ),
        (
            {"agent_connectors": [{"name": "MeanStdObservationFilterAgentConnector", "clip": [1]}]},
            "policies.p.agent_connectors[0].clip",
            ["got [1]"],
        ),
        (
            {"agent_connectors": ["ObsPreprocessorConnector", "NormalizeActionsConnector"]},
            "policies.p.agent_connectors[1]",
            ["NormalizeActionsConnector, an action connector", "belongs in the action chain"],
        ),
        (
            {"action_connectors": ["ClipRewardAgentConnector"]},
            "policies.p.action_connectors[0]",
            ["an agent connector", "not an ActionConnector"],
        ),
        (
            {"action_connectors": [{"name": "ConvertToNumpyConnector", "device": "cpu"}]},
            "policies.p.action_connectors[0].device",
            ["unknown parameter 'device'", "no parameters"],
        ),
        (
            {"model": {"hiden": [64]}},
            "policies.p.model.hiden",
            ["did you mean 'hidden'", "mlp model"],
        ),
        (
            {"model": {"type": "lstm", "cell_size": 8}},
            "policies.p.model.cell_size",
            ["'lstm_cell_size'"],
        ),
        (
            {"model": {"type": "mlp", "lstm_cell_size": 8}},
            "policies.p.model.lstm_cell_size",
            ["mlp model"],
        ),
        ({"model": {"activation": "gelu"}}, "policies.p.model.activation", ["'tanh', 'relu'"]),
        (
            {"model": {"type": "lstm", "lstm_cell_size": 0}},
            "policies.p.model.lstm_cell_size",
            [">= 1"],
        ),
        (
            {"model": {"vf_share_layers": "yes"}},
            "policies.p.model.vf_share_layers",
            ["true or false"],
        ),
    ],
)
def test_from_dict_names_the_key(policy: dict, key: str, words: list[str]) -> None:
    """Regression: these loaded fine and failed only when sampling, naming no key."""
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_dict(config_with(**policy))
    assert info.value.key == key
    for word in words:
        assert word in str(info.value), str(info.value)


def test_good_chains_and_models_load() -> None:
    config = RunnerConfig.from_dict(
        config_with(
            model={"type": "lstm", "hidden": [32], "lstm_cell_size": 16, "activation": "relu"},
            agent_connectors=[
                "ObsPreprocessorConnector",
                {"name": "ClipRewardAgentConnector", "limit": 1, "sign": False},
                {"name": "MeanStdObservationFilterAgentConnector", "clip": None},
            ],
            action_connectors=["ConvertToNumpyConnector", "NormalizeActionsConnector"],
        )
    )
    assert config.policies["p"]["agent_connectors"][1] == {
        "name": "ClipRewardAgentConnector",
        "limit": 1,
        "sign": False,
    }
    # a custom model class takes whatever keys its constructor does
    custom = RunnerConfig.from_dict(config_with(model={"class": "pkg.models:Net", "width": 3}))
    assert custom.policies["p"]["model"] == {"class": "pkg.models:Net", "width": 3}


def test_import_path_connectors_are_checked_by_check_imports() -> None:
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "marl_runner.bench.envs.scripted_env:ScriptedEnv"},
            "policies": {
                "p": {
                    "action_connectors": ["ConvertToNumpyConnector", "no_such_pkg_xyz.conn:Squash"]
                },
                "q": {
                    "agent_connectors": [
                        "helpers_connectors:AddToObs",
                        {"name": "helpers_connectors:AddToObs", "amout": 2},
                    ]
                },
            },
            "policy_mapping_fn": {"*": "p"},
        }
    )
    with pytest.raises(ConfigError) as info:
        config.check_imports()
    assert info.value.key == "policies.p.action_connectors[1]"
    assert "no module named 'no_such_pkg_xyz'" in str(info.value)
    config.policies["p"]["action_connectors"].pop()
    with pytest.raises(ConfigError) as info:
        config.check_imports()
    assert info.value.key == "policies.q.agent_connectors[1].amout"
    assert "did you mean 'amount'" in str(info.value)
