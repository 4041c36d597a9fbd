"""`marl-runner validate`: builds what `sample` builds (minus stepping), so both reject the same configs.

The env is a small real MultiAgentEnv named by import path, as a user's would be.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

from marl_runner import EnvRunner, RandomPolicy, RunnerConfig
from marl_runner.bench.envs.scripted_env import OBS_SPACE, ScriptedEnv, every_round_script
from marl_runner.bench.workloads import get_workload
from marl_runner.cli import main
from marl_runner.cli.validate import BATCH_COLUMNS
from marl_runner.config import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"
AGENTS = ("archer_0", "archer_1", "knight_0")
MODULE = __name__


class ArcherKnightEnv(ScriptedEnv):
    """Archers act in Discrete(6), the knight in Discrete(knight_actions)."""

    def __init__(self, knight_actions: int = 4) -> None:
        super().__init__(every_round_script(AGENTS, 3), AGENTS, action_space=gym.spaces.Discrete(6))
        self.action_spaces["knight_0"] = gym.spaces.Discrete(knight_actions)


class BrokenEnv(ScriptedEnv):
    def __init__(self, **kwargs: Any) -> None:
        raise TypeError(f"__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")


def map_with_worker(agent_id: str, episode: Any, worker: Any, **kwargs: Any) -> str:
    """RLlib's signature: the runner passes ``worker=``; a mapping without it fails."""
    assert worker is not None, "the runner passes worker="
    return "archer" if agent_id.startswith("archer") else "knight"


def map_everyone_to_shared(agent_id: str, episode: Any, **kwargs: Any) -> str:
    return "shared"


def map_raising(agent_id: str, episode: Any) -> str:
    raise KeyError(agent_id)


def write_config(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "env": {"name": f"{MODULE}:ArcherKnightEnv"},
        "num_envs": 2,
        "rollout_fragment_length": 10,
        "policies": {"archer": {}, "knight": {}},
        "policy_mapping_fn": {"archer_*": "archer", "knight_*": "knight"},
    }
    data.update(changes)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def archer(**spec: Any) -> dict[str, Any]:
    """Policies with ``spec`` for the archer."""
    return {"policies": {"archer": spec, "knight": {}}}


def one_line_error(err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(autouse=True)
def _importable_test_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configs name this module's envs and mapping fns by import path."""
    monkeypatch.setitem(sys.modules, MODULE, sys.modules[__name__])


def test_prints_agents_policies_and_spaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path)
    assert main(["validate", str(path), "--set", "env.config.knight_actions=5"]) == 0
    out = capsys.readouterr().out
    for text in ("archer_0", "archer_1", "knight_0", "Discrete(6)", "Discrete(5)", str(OBS_SPACE)):
        assert text in out
    assert "config OK" in out
    assert "archer_1 │ archer" in out.replace("  ", " ").replace("  ", " ")


def test_shows_the_batch_columns_and_those_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(write_config(tmp_path))]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("batch columns"))
    assert "new_obs" in line and "continues" in line and "left out" not in line
    path = write_config(tmp_path, exclude_columns=["new_obs", "infos"])
    assert main(["validate", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("batch columns"))
    kept, _, left_out = line.partition("; left out (exclude_columns): ")
    assert left_out == "new_obs, infos" and "new_obs" not in kept and "infos" not in kept


def test_the_batch_columns_it_lists_are_those_a_runner_hands_out() -> None:
    """validate lists the columns without sampling: the list must match a real batch's."""
    with EnvRunner(get_workload("cheap").config(rollout_fragment_length=8)) as runner:
        columns = set(next(iter(runner.sample().policy_batches.values())).keys())
    assert set(BATCH_COLUMNS) <= columns
    assert columns - set(BATCH_COLUMNS) == {"action_logp", "action_dist_inputs", "vf_preds"}


def test_notes_unused_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, policies={"archer": {}, "knight": {}, "zombie": {}})
    assert main(["validate", str(path)]) == 0
    assert "note: policy 'zombie' has no agent" in capsys.readouterr().out


def test_mapping_fn_with_rllib_signature_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 8, defect 5): validate called the mapping as fn(agent, None), without worker=."""
    path = write_config(tmp_path, policy_mapping_fn=f"{MODULE}:map_with_worker")
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    assert "config OK" in capsys.readouterr().out


#: Configs that `sample` rejected at build time but the old `validate` passed, and the key named.
BUILD_TIME_ERRORS = [
    pytest.param(
        archer(
            agent_connectors=[
                "ObsPreprocessorConnector",
                {"name": "ClipRewardAgentConnector", "limt": 1},
            ]
        ),
        ["policies.archer.agent_connectors[1].limt", "did you mean 'limit'"],
        id="misspelled-param",
    ),
    pytest.param(
        archer(agent_connectors=[{"name": "ClipRewardAgentConnector", "limit": "abc"}]),
        ["policies.archer.agent_connectors[0].limit", "'abc'", "a number"],
        id="param-type",
    ),
    pytest.param(
        archer(agent_connectors=[{"name": "ClipRewardAgentConnector", "limit": -1}]),
        ["policies.archer.agent_connectors[0].limit", "> 0"],
        id="param-value",
    ),
    pytest.param(
        archer(agent_connectors=["ClipActionsConnector"]),
        ["policies.archer.agent_connectors[0]", "ClipActionsConnector", "action chain"],
        id="action-connector-in-agent-chain",
    ),
    pytest.param(
        archer(model={"hiden": [64]}),
        ["policies.archer.model.hiden", "did you mean 'hidden'"],
        id="model-key",
    ),
    pytest.param(
        archer(action_connectors=["no_such_pkg_xyz.connectors:Squash"]),
        ["policies.archer.action_connectors[0]", "no module named 'no_such_pkg_xyz'"],
        id="missing-import-path",
    ),
    pytest.param(
        archer(agent_connectors=[f"{MODULE}:NoSuchConnector"]),
        ["policies.archer.agent_connectors[0]", "has no attribute 'NoSuchConnector'"],
        id="missing-class",
    ),
    pytest.param(
        archer(
            agent_connectors=["MeanStdObservationFilterAgentConnector"],
            observation_space={"type": "Discrete", "n": 3},
        ),
        ["policies.archer.observation_space", "Discrete(3)", "Box"],
        id="declared-obs-space",
    ),
    pytest.param(
        archer(action_space={"type": "Discrete", "n": 5}),
        ["policies.archer.action_space", "'archer'", "Discrete(5)", "Discrete(6)"],
        id="declared-action-space",
    ),
]


@pytest.mark.parametrize(("changes", "words"), BUILD_TIME_ERRORS)
def test_validate_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, words: list[str]
) -> None:
    path = write_config(tmp_path, **changes)
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert "config OK" not in captured.out
    one_line_error(captured.err, "marl-runner validate: error:", *words)


#: Configs rejected when loaded or built, and words of the error; validate and sample
#: (issue 17.12) must both exit 2 with the same message.
REJECTED_CONFIGS = [
        ({"num_env": 3}, ["run.yaml", "num_env: unknown key", "num_envs"]),
        (archer(model={"type": "gru"}), ["policies.archer.model.type", "'mlp'"]),
        (
            {"callbacks": "no_such_module_xyz:Cb"},
            ["callbacks:", "no module named 'no_such_module_xyz'"],
        ),
        (
            {"policy_mapping_fn": "examples.mappings:shared"},
            ["policy_mapping_fn:", "'shared'", "'archer_0'", "not a known policy id"],
        ),
        (
            {"policy_mapping_fn": {"archer_*": "archer"}},
            ["policy_mapping_fn:", "'knight_0'", "matches none of the patterns"],
        ),
        ({"policy_mapping_fn": None}, ["policy_mapping_fn", "required when there are 2 policies"]),
        (
            {"policy_mapping_fn": f"{MODULE}:map_raising"},
            ["policy_mapping_fn failed for agent 'archer_0'", "KeyError"],
        ),
        (
            {"policy_mapping_fn": {"*": "archer"}},
            [
                "policies.archer",
                "'archer_0' and 'knight_0'",
                "different action spaces",
                "Discrete(6)",
            ],
        ),
        ({"vectorize": "subproces"}, ["vectorize", "did you mean 'subprocess'"]),
    pytest.param(
        {"env": {"name": f"{MODULE}:BrokenEnv", "config": {"sise": 3}}},
        [f"env: cannot build '{MODULE}:BrokenEnv'", "'sise'"],
        id="env-constructor-raises",
    ),
    pytest.param(
        {
            "policies": {"../../evil": {}, "knight": {}},
            "policy_mapping_fn": {"archer_*": "../../evil", "knight_*": "knight"},
        },
        ["policies.../../evil", "file name", "did you mean 'evil'"],
        id="policy-id-not-a-file-name",
    ),
]


@pytest.mark.parametrize(("changes", "words"), REJECTED_CONFIGS)
def test_rejects_bad_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], words: list[str]
) -> None:
    path = write_config(tmp_path, **changes)
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert "config OK" not in captured.out
    one_line_error(captured.err, "marl-runner validate: error:", *words)


@pytest.mark.parametrize(("changes", "words"), REJECTED_CONFIGS + BUILD_TIME_ERRORS)
def test_sample_and_validate_give_the_same_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], words: list[str]
) -> None:
    """Issue 17.12: same exit code and message, also with --out (which writes policy ids)."""
    path = write_config(tmp_path, **changes)
    assert main(["validate", str(path)]) == 2
    validate_error = one_line_error(capsys.readouterr().err, *words)
    assert main(["sample", str(path), "--steps", "5", "--out", str(tmp_path / "out")]) == 2
    sample_error = one_line_error(capsys.readouterr().err, *words)
    assert sample_error.replace("marl-runner sample:", "marl-runner validate:") == validate_error
    assert not list((tmp_path / "out").glob("batch_*"))


@pytest.mark.parametrize("pid", ["archer-1", "archer.v2", "ARCHER_0", "a..b"])
def test_file_name_safe_policy_ids_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pid: str
) -> None:
    path = write_config(
        tmp_path,
        policies={pid: {}, "knight": {}},
        policy_mapping_fn={"archer_*": pid, "knight_*": "knight"},
    )
    assert main(["sample", str(path), "--steps", "5", "--out", str(tmp_path / "out")]) == 0
    assert list((tmp_path / "out").glob("batch_*"))


def test_traceback_flag_shows_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"name": f"{MODULE}:BrokenEnv", "config": {"bad": 1}}
    assert main(["validate", str(write_config(tmp_path, env=env)), "--traceback"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "TypeError" in err


def test_yaml_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("env:\n  name: x\n policies: {}\n")
    assert main(["validate", str(path)]) == 2
    one_line_error(capsys.readouterr().err, "broken.yaml", "line 3")


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    one_line_error(capsys.readouterr().err, "nope.yaml", "cannot read")


def test_bad_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(write_config(tmp_path)), "--set", "num_envs=0"]) == 2
    one_line_error(capsys.readouterr().err, "num_envs: got 0, expected an integer >= 1")


EXPECTED_AGENTS = {
    "kaz.yaml": {
        "archer_0": "archer",
        "archer_1": "archer",
        "knight_0": "knight",
        "knight_1": "knight",
    },
    "simple_spread.yaml": {"agent_0": "shared", "agent_1": "shared", "agent_2": "shared"},
    "connect_four.yaml": {"player_0": "player_0", "player_1": "player_1"},
    "tictactoe.yaml": {"player_1": "player_1", "player_2": "player_2"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_AGENTS))
def test_example_configs_with_real_envs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES / name)]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in out.splitlines()
        if line.count("│") >= 4 and line.split("│")[1].strip() in EXPECTED_AGENTS[name]
    }
    assert rows == EXPECTED_AGENTS[name]
    assert "config OK" in out


# ----------------------------------------------------------------------------- build-time space checks


def runner_config(**changes: Any) -> RunnerConfig:
    data: dict[str, Any] = {
        "env": {"name": f"{MODULE}:ArcherKnightEnv", "config": {"knight_actions": 5}},
        "policies": {"archer": {}, "knight": {}},
        "policy_mapping_fn": {"archer_*": "archer", "knight_*": "knight"},
    }
    data.update(changes)
    return RunnerConfig.from_dict(data)


def test_configured_action_space_that_does_not_fit_the_agents() -> None:
    config = runner_config(
        policies={"archer": {}, "knight": {"action_space": {"type": "Discrete", "n": 3}}}
    )
    with pytest.raises(ConfigError) as info:
        EnvRunner(config)
    assert info.value.key == "policies.knight.action_space"
    for word in ("'knight'", "Discrete(3)", "Discrete(5)"):
        assert word in str(info.value)


def test_ready_made_policy_with_box_actions_for_a_discrete_env() -> None:
    box_policy = RandomPolicy(OBS_SPACE, gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    with pytest.raises(ConfigError) as info:
        EnvRunner(runner_config(), policies={"knight": box_policy})
    assert info.value.key == "policies.knight"
    for word in ("'knight'", "Box(-1.0, 1.0, (2,), float32)", "Discrete(5)"):
        assert word in str(info.value)


PISTONBALL = str(EXAMPLES / "pistonball.yaml")


def test_warns_when_images_feed_an_mlp(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21: 64x64x4 uint8 frames into an MLP used to validate silently."""
    assert main(["validate", PISTONBALL, "--set", "policies.shared.model={type: mlp}"]) == 0
    out = capsys.readouterr().out
    warning = next(line for line in out.splitlines() if line.startswith("warning:"))
    for words in ("policy 'shared'", "Box(0, 255, (64, 64, 4), uint8)", "mlp", "16,384 inputs"):
        assert words in warning, warning
    assert "policies.shared.model.type: cnn" in out and "config OK" in out


def test_no_image_warning_for_a_cnn(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", PISTONBALL]) == 0
    assert "warning:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("space", "image"),
    [
        (gym.spaces.Box(0, 255, (84, 84, 3), np.uint8), True),
        (gym.spaces.Box(0, 255, (32, 40, 1), np.uint8), True),
        (gym.spaces.Box(0, 255, (31, 84, 3), np.uint8), False),  # too small to be a picture
        (gym.spaces.Box(0, 255, (84, 84, 2), np.uint8), False),  # 2 channels: not an image
        (gym.spaces.Box(0.0, 1.0, (84, 84, 3), np.float32), False),
        (gym.spaces.Box(0, 255, (84, 84), np.uint8), False),
    ],
)
def test_image_shaped_boxes(space: gym.Space, image: bool) -> None:
    from marl_runner.cli.validate import is_image_shaped

    assert is_image_shaped(space) is image


BATTLE = {
    "env": {
        "name": "magent2.environments.battle_v4:parallel_env",
        "config": {"map_size": 45, "max_cycles": 200},
        "api": "parallel",
    },
    "policies": {"red": {}, "blue": {}},
    "policy_mapping_fn": {"red_*": "red", "blue_*": "blue"},
}


def test_many_agents_are_grouped_by_policy_and_verbose_lists_them_all(
    tmp_path, capsys, monkeypatch
):
    """MAgent2 battle: 162 agents were 170 lines, one table row each."""
    pytest.importorskip("magent2")
    monkeypatch.setenv("COLUMNS", "200")  # rows unwrapped, as in a wide terminal
    path = tmp_path / "battle.yaml"
    path.write_text(yaml.safe_dump(BATTLE))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 40
    assert "red_0 … red_80 (81 agents)" in out and "blue_0 … blue_80 (81 agents)" in out
    assert out.count("Discrete(21)") == 2  # each policy's spaces once
    assert main(["validate", str(path), "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert all(f"{team}_{i} " in verbose for team in ("red", "blue") for i in range(81))
