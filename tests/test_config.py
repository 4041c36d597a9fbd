"""RunnerConfig: loading, defaults, round trips, overrides and every ConfigError."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

from marl_runner.config import ConfigError, RunnerConfig, space_from_spec, space_to_spec

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "configs").glob("*.yaml"))
MINIMAL: dict[str, Any] = {
    "env": {"name": "pettingzoo.classic.tictactoe_v3:env"},
    "policies": {"only": None},
}
FULL: dict[str, Any] = {
    "env": {
        "name": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
        "config": {"max_cycles": 300, "obs_method": "vector"},
        "api": "parallel",
    },
    "num_envs": 8,
    "vectorize": "subprocess",
    "num_workers": 4,
    "rollout_fragment_length": 100,
    "batch_mode": "complete_episodes",
    "count_steps_by": "agent_steps",
    "restart_failed_sub_environments": True,
    "remote_env_batch_wait_ms": 2.5,
    "fake_obs": "last",
    "seed": None,
    "device": "cuda:1",
    "explore": False,
    "normalize_actions": True,
    "policies": {
        "archer": {
            "model": {"type": "lstm", "hidden": [32], "lstm_cell_size": 64},
            "policy_class": "marl_runner.policy:TorchPolicy",
            "agent_connectors": [
                "ObsPreprocessorConnector",
                {"name": "ClipRewardAgentConnector", "limit": 1.0},
            ],
            "action_connectors": ["ConvertToNumpyConnector"],
            "observation_space": {"type": "Box", "low": -1.0, "high": 1.0, "shape": [27, 5]},
            "action_space": {"type": "Discrete", "n": 6},
            "config": {"gamma": 0.95},
        },
        "knight": {"model": {"class": "my_models:KnightNet", "width": 3}},
    },
    "policy_mapping_fn": {"archer_*": "archer", "knight_*": "knight"},
    "callbacks": "my_callbacks:Logger",
    "ema_coef": 0.01,
}


def config_with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data.update(changes)
    return data


def assert_plain(value: Any, where: str = "config") -> None:
    """YAML-safe builtins only, all the way down."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), f"{where}: key {k!r}"
            assert_plain(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            assert_plain(v, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (str, bool, int, float), f"{where}: {value!r}"


# ----------------------------------------------------------------------------- loading


def test_defaults_of_a_minimal_config() -> None:
    config = RunnerConfig.from_dict(MINIMAL)
    assert config.env == {
        "name": "pettingzoo.classic.tictactoe_v3:env",
        "config": {},
        "api": "auto",
    }
    assert config.num_envs == 1
    assert config.vectorize == "sync"
    assert config.num_workers is None
    assert config.rollout_fragment_length == 200
    assert config.batch_mode == "truncate_episodes"
    assert config.count_steps_by == "env_steps"
    assert config.restart_failed_sub_environments is False
    assert config.remote_env_batch_wait_ms == 0
    assert config.fake_obs == "zeros"
    assert config.seed == 0
    assert config.device == "cpu"
    assert config.explore is True
    assert config.normalize_actions is False
    assert config.policy_mapping_fn is None
    assert config.callbacks is None
    assert config.ema_coef is None
    assert config.policies == {
        "only": {
            "model": {"type": "mlp"},
            "policy_class": None,
            "agent_connectors": None,
            "action_connectors": None,
            "observation_space": None,
            "action_space": None,
            "config": {},
        }
    }


def test_full_config_is_normalised() -> None:
    config = RunnerConfig.from_dict(FULL)
    archer = config.policies["archer"]
    assert archer["observation_space"] == gym.spaces.Box(-1.0, 1.0, (27, 5), np.float32)
    assert archer["action_space"] == gym.spaces.Discrete(6)
    assert archer["agent_connectors"][1] == {"name": "ClipRewardAgentConnector", "limit": 1.0}
    assert config.policies["knight"]["model"] == {"class": "my_models:KnightNet", "width": 3}
    assert config.policy_mapping_fn == {"archer_*": "archer", "knight_*": "knight"}


@pytest.mark.parametrize("data", [MINIMAL, FULL], ids=["minimal", "full"])
def test_dict_round_trip_is_plain_yaml(data: dict[str, Any]) -> None:
    config = RunnerConfig.from_dict(data)
    as_dict = config.to_dict()
    assert_plain(as_dict)
    reloaded = yaml.safe_load(yaml.safe_dump(as_dict, sort_keys=False))
    assert RunnerConfig.from_dict(reloaded) == config
    assert RunnerConfig.from_dict(as_dict).to_dict() == as_dict


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_configs_round_trip(path: Path, tmp_path: Path) -> None:
    config = RunnerConfig.from_yaml(path)
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    assert RunnerConfig.from_yaml(saved) == config
    config.check_imports()


def test_example_configs_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"kaz.yaml", "simple_spread.yaml", "connect_four.yaml", "tictactoe.yaml"} <= names


def test_input_data_is_not_aliased() -> None:
    data = copy.deepcopy(FULL)
    config = RunnerConfig.from_dict(data)
    data["env"]["config"]["max_cycles"] = 1
    data["policies"]["archer"]["model"]["hidden"].append(7)
    assert config.env["config"]["max_cycles"] == 300
    assert config.policies["archer"]["model"]["hidden"] == [32]
    config.to_dict()["policies"]["archer"]["config"]["gamma"] = 0.0
    assert config.policies["archer"]["config"]["gamma"] == 0.95


def test_config_pickles_for_worker_processes() -> None:
    config = RunnerConfig.from_dict(FULL)
    assert pickle.loads(pickle.dumps(config)) == config


def test_direct_construction_and_replace_validate() -> None:
    config = RunnerConfig(env={"name": "x:y"}, policies={"p": {}})
    assert config.env["api"] == "auto"
    assert dataclasses.replace(config, num_envs=3).num_envs == 3
    with pytest.raises(ConfigError, match="num_envs"):
        dataclasses.replace(config, num_envs=0)


def test_backend_keys_are_attributes_kept_by_replace_and_pickling() -> None:
    config = RunnerConfig(
        env={"name": "x:y"}, policies={"p": {}}, vectorize="subprocess", num_envs=4,
        num_workers=2, num_envs_per_poll=2,
    )
    assert config.num_workers == 2 and config.vector_options["num_envs_per_poll"] == 2
    assert config.pin_workers is True  # defaults filled in
    replaced = dataclasses.replace(config, seed=5)
    assert (replaced.seed, replaced.num_workers, replaced.num_envs_per_poll) == (5, 2, 2)
    assert dataclasses.replace(config, num_workers=4).num_workers == 4
    with pytest.raises(ConfigError, match=r"num_workers: got 5, expected at most num_envs \(4\)"):
        dataclasses.replace(config, num_workers=5)
    config.pin_workers = False
    assert config.to_dict()["pin_workers"] is False
    assert pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(AttributeError, match="no attribute 'num_worker'"):
        config.num_worker  # noqa: B018
    with pytest.raises(ConfigError, match="vector_options: unknown key"):
        RunnerConfig.from_dict({**MINIMAL, "vector_options": {}})
    with pytest.raises(ConfigError, match="env: missing"):
        RunnerConfig(policies={"p": {}})


def test_env_name_shorthand_and_registered_name() -> None:
    assert RunnerConfig.from_dict(config_with(env="pkg.mod:make")).env["name"] == "pkg.mod:make"
    assert RunnerConfig.from_dict(config_with(env={"name": "my_env"})).env["name"] == "my_env"


def test_spaces_given_as_objects_or_specs() -> None:
    box = gym.spaces.Box(np.array([0.0, -np.inf]), np.array([1.0, np.inf]), dtype=np.float64)
    spaces = [
        gym.spaces.Discrete(4, start=1),
        box,
        gym.spaces.Box(0, 255, (2, 2), np.uint8),
        gym.spaces.MultiDiscrete([3, 4]),
        gym.spaces.MultiBinary(5),
        gym.spaces.Dict({"obs": box, "action_mask": gym.spaces.Box(0, 1, (9,), np.int8)}),
        gym.spaces.Tuple([gym.spaces.Discrete(2), box]),
    ]
    for space in spaces:
        spec = space_to_spec(space)
        assert_plain(spec)
        assert space_from_spec(yaml.safe_load(yaml.safe_dump(spec))) == space
        data = config_with(policies={"p": {"observation_space": space, "action_space": spec}})
        config = RunnerConfig.from_dict(data)
        assert config.policies["p"]["observation_space"] == space
        assert config.policies["p"]["action_space"] == space


# ----------------------------------------------------------------------------- errors


def policy(**spec: Any) -> dict[str, Any]:
    return {"policies": {"archer": spec}}


ERROR_CASES = [
    # (changes to MINIMAL, dotted key named, words the message must contain)
    ({"num_env": 4}, "num_env", ["unknown key", "num_envs"]),
    ({"polices": {"a": {}}}, "polices", ["unknown key", "policies"]),
    ({"env": {"name": "x:y", "conf": {}}}, "env.conf", ["unknown key", "config"]),
    ({"env": {"config": {}}}, "env.name", ["missing", "module:callable"]),
    ({"env": {"name": ""}}, "env.name", ["non-empty"]),
    ({"env": {"name": "x:y", "api": "gym"}}, "env.api", ["'gym'", "'parallel'", "'aec'"]),
    ({"env": {"name": "x:y", "config": [1]}}, "env.config", ["mapping"]),
    ({"env": {"name": "a b:c"}}, "env.name", ["import path"]),
    ({"env": 3}, "env", ["'name'"]),
    ({"num_envs": 0}, "num_envs", ["0", "integer >= 1"]),
    ({"num_envs": "4"}, "num_envs", ["'4'", "integer"]),
    ({"num_envs": True}, "num_envs", ["True", "integer"]),
    ({"num_workers": 0}, "num_workers", ["integer >= 1"]),
    (
        {"vectorize": "subprocess", "num_workers": 2},
        "num_workers",
        ["got 2", "at most num_envs (1)"],
    ),
    ({"rollout_fragment_length": 2.5}, "rollout_fragment_length", ["2.5", "integer >= 1"]),
    ({"vectorize": "async"}, "vectorize", ["'async'", "'sync'", "'subprocess'", "'ray'"]),
    ({"batch_mode": "complete"}, "batch_mode", ["'complete_episodes'"]),
    ({"count_steps_by": "steps"}, "count_steps_by", ["'env_steps'", "'agent_steps'"]),
    (
        {"restart_failed_sub_environments": "yes"},
        "restart_failed_sub_environments",
        ["true or false"],
    ),
    ({"remote_env_batch_wait_ms": -1}, "remote_env_batch_wait_ms", ["-1", ">= 0"]),
    ({"fake_obs": "random"}, "fake_obs", ["'zeros'", "'sample'", "'last'"]),
    ({"seed": 1.5}, "seed", ["1.5", "integer"]),
    ({"device": "gpu"}, "device", ["'gpu'", "'cpu'", "'cuda'", "'auto'"]),
    ({"explore": 1}, "explore", ["true or false"]),
    ({"normalize_actions": None}, "normalize_actions", ["true or false"]),
    ({"ema_coef": 0}, "ema_coef", ["(0, 1]"]),
    ({"ema_coef": 1.5}, "ema_coef", ["(0, 1]"]),
    ({"callbacks": "nocolon"}, "callbacks", ["'nocolon'", "module:name"]),
    ({"callbacks": print}, "callbacks", ["module:name"]),
    ({"policies": {}}, "policies", ["empty", "at least one policy"]),
    ({"policies": ["a", "b"]}, "policies", ["mapping of policy id"]),
    ({"policies": {1: {}}}, "policies.1", ["non-empty string"]),
    (policy(modle={}), "policies.archer.modle", ["unknown key", "model"]),
    (
        policy(model={"type": "gru"}),
        "policies.archer.model.type",
        ["'gru'", "'mlp'", "'lstm'", "'cnn'", "class"],
    ),
    (policy(model={"type": "mlp", "class": "a:B"}), "policies.archer.model", ["both"]),
    (
        policy(model={"class": "NoModule"}),
        "policies.archer.model.class",
        ["'NoModule'", "import path"],
    ),
    (policy(model={"hidden": [64, 0]}), "policies.archer.model.hidden", ["[64, 0]", "layer sizes"]),
    (policy(model=[64]), "policies.archer.model", ["mapping"]),
    (policy(policy_class="Torch"), "policies.archer.policy_class", ["import path"]),
    (
        policy(agent_connectors="Clip"),
        "policies.archer.agent_connectors",
        ["list of connector names"],
    ),
    (
        policy(agent_connectors=["ObsPreprocessorConnector", 3]),
        "policies.archer.agent_connectors[1]",
        ["3", "connector name", "'name'"],
    ),
    (
        policy(
            agent_connectors=[
                "ObsPreprocessorConnector",
                {"name": "ClipRewardConnector", "limit": 1},
            ]
        ),
        "policies.archer.agent_connectors[1]",
        [
            "unknown agent connector 'ClipRewardConnector'",
            "did you mean 'ClipRewardAgentConnector'",
            "register_connector",
        ],
    ),
    (policy(action_connectors=[{"limit": 1}]), "policies.archer.action_connectors[0]", ["'name'"]),
    (
        policy(observation_space={"type": "Boxx"}),
        "policies.archer.observation_space",
        ["'Box'", "'Discrete'"],
    ),
    (policy(action_space={"type": "Discrete"}), "policies.archer.action_space", ["missing 'n'"]),
    (
        policy(action_space={"type": "Discrete", "n": 2, "m": 1}),
        "policies.archer.action_space.m",
        ["unknown key"],
    ),
    (policy(config=[1]), "policies.archer.config", ["mapping"]),
    (
        {"policy_mapping_fn": {"*": "knight"}},
        "policy_mapping_fn.*",
        ["unknown policy id 'knight'", "'only'"],
    ),
    ({"policy_mapping_fn": {}}, "policy_mapping_fn", ["empty"]),
    ({"policy_mapping_fn": 3}, "policy_mapping_fn", ["import path", "glob"]),
    ({"policy_mapping_fn": print}, "policy_mapping_fn", ["EnvRunner(policy_mapping_fn=...)"]),
    ({"policy_mapping_fn": "by_prefix"}, "policy_mapping_fn", ["'by_prefix'", "import path"]),
]


@pytest.mark.parametrize(("changes", "key", "words"), ERROR_CASES, ids=[c[1] for c in ERROR_CASES])
def test_config_errors_name_key_and_expectation(changes: dict, key: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_dict(config_with(**changes))
    assert info.value.key == key
    message = str(info.value)
    assert message.startswith(f"{key}: ")
    for word in words:
        assert word in message


def test_missing_required_sections() -> None:
    with pytest.raises(ConfigError, match=r"^env: missing"):
        RunnerConfig.from_dict({"policies": {"a": {}}})
    with pytest.raises(ConfigError, match=r"^policies: missing; .*at least one policy"):
        RunnerConfig.from_dict({"env": {"name": "x:y"}})
    with pytest.raises(ConfigError, match="mapping of keys to values"):
        RunnerConfig.from_dict(["env"])  # type: ignore[arg-type]


def test_connector_import_paths_are_left_to_the_registry() -> None:
    data = config_with(policies={"p": {"action_connectors": ["my_pkg.connectors:Squash"]}})
    assert RunnerConfig.from_dict(data).policies["p"]["action_connectors"] == [
        "my_pkg.connectors:Squash"
    ]


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_mapping_dict_suggests_close_policy_id() -> None:
    data = config_with(policies={"archer": {}, "knight": {}}, policy_mapping_fn={"a*": "archr"})
    with pytest.raises(ConfigError, match="did you mean 'archer'"):
        RunnerConfig.from_dict(data)


# ----------------------------------------------------------------------------- YAML files


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_yaml_reads_exponent_floats_without_a_dot(tmp_path: Path) -> None:
    path = write(tmp_path, "env: {name: 'x:y'}\npolicies: {a: {config: {lr: 1e-3, eps: -2E+2}}}\n")
    assert RunnerConfig.from_yaml(path).policies["a"]["config"] == {"lr": 1e-3, "eps": -200.0}


def test_yaml_that_does_not_parse_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "env:\n  name: x:y\npolicies:\n  a: {model: [}\n")
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_yaml(path)
    assert str(path) in str(info.value)
    assert "line 4" in str(info.value)


def test_yaml_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "env: {name: 'x:y'}\npolicies:\n  a: {}\n  a: {}\n")
    with pytest.raises(ConfigError, match=r"line 4.*duplicate key 'a'"):
        RunnerConfig.from_yaml(path)


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = (
        "env: {name: 'x:y'}\n"
        "policies:\n"
        "  a: &shared {model: {type: mlp}, config: {gamma: 0.9}}\n"
        "  b:\n"
        "    <<: *shared\n"
        "    config: {gamma: 0.5}\n"
    )
    config = RunnerConfig.from_yaml(write(tmp_path, text))
    assert config.policies["b"]["config"] == {"gamma": 0.5}
    assert config.policies["a"]["config"] == {"gamma": 0.9}


def test_yaml_errors_in_values_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "env: {name: 'x:y'}\npolicies: {a: {model: {type: gru}}}\n")
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_yaml(path)
    assert info.value.key == "policies.a.model.type"
    assert str(info.value).startswith(f"{path}: policies.a.model.type: got 'gru'")


@pytest.mark.parametrize(
    ("text", "words"),
    [("", "empty"), ("- a\n- b\n", "mapping of keys"), ("just text", "mapping of keys")],
)
def test_yaml_file_of_the_wrong_shape(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RunnerConfig.from_yaml(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        RunnerConfig.from_yaml(tmp_path / "nope.yaml")


# ----------------------------------------------------------------------------- overrides


def test_overrides_reach_nested_keys_and_parse_yaml() -> None:
    base = RunnerConfig.from_dict(FULL)
    config = base.with_overrides(
        [
            "num_envs=4",
            "policies.archer.model.hidden=[32,32]",
            "env.config.max_cycles=50",
            "seed=null",
            "explore=true",
            "policy_mapping_fn=examples.mappings:by_prefix",
            "policies.knight.config.lr=1e-3",
        ]
    )
    assert config.num_envs == 4
    assert config.policies["archer"]["model"]["hidden"] == [32, 32]
    assert config.env["config"] == {"max_cycles": 50, "obs_method": "vector"}
    assert config.seed is None
    assert config.explore is True
    assert config.policy_mapping_fn == "examples.mappings:by_prefix"
    assert config.policies["knight"]["config"] == {"lr": 1e-3}
    assert base.num_envs == 8  # the original is untouched


def test_override_creates_missing_mappings() -> None:
    config = RunnerConfig.from_dict(MINIMAL).with_overrides(["env.config.max_cycles=50"])
    assert config.env["config"] == {"max_cycles": 50}


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("num_envs", None, ["'num_envs'", "dotted.key=value"]),
        ("=3", None, ["dotted.key=value"]),
        ("env..name=x", None, ["dotted.key=value"]),
        ("num_envs=[1,", "num_envs", ["not valid YAML"]),
        ("num_envz=3", "num_envz", ["unknown key", "num_envs"]),
        ("num_envs=zero", "num_envs", ["'zero'", "integer >= 1"]),
        ("seed.value=1", "seed", ["not a mapping"]),
        ("policies.archer.modell.type=mlp", "policies.archer.modell", ["unknown key", "model"]),
    ],
)
def test_bad_overrides(override: str, key: str | None, words: list[str]) -> None:
    base = RunnerConfig.from_dict(config_with(policies={"archer": {}}))
    with pytest.raises(ConfigError) as info:
        base.with_overrides([override])
    assert info.value.key == key
    for word in words:
        assert word in str(info.value)


# ----------------------------------------------------------------------------- imports


def test_check_imports_names_the_key() -> None:
    config = RunnerConfig.from_dict(config_with(callbacks="no_such_module_xyz:Callbacks"))
    with pytest.raises(ConfigError) as info:
        config.check_imports()
    assert info.value.key == "callbacks"
    assert "no module named 'no_such_module_xyz'" in str(info.value)

    config = RunnerConfig.from_dict(config_with(policy_mapping_fn="examples.mappings:by_prefx"))
    with pytest.raises(ConfigError, match=r"^policy_mapping_fn: .*has no attribute 'by_prefx'"):
        config.check_imports()

    config = RunnerConfig.from_dict(config_with(policies={"p": {"model": {"class": "math:pi"}}}))
    with pytest.raises(
        ConfigError, match=r"^policies\.p\.model\.class: .*expected something callable"
    ):
        config.check_imports()


@pytest.mark.parametrize(
    ("spec", "where", "expected"),
    [
        ({"type": "Box", "low": 0, "high": 1, "shape": [100_000, 100_000]}, "shape", "elements"),
        ({"type": "Box", "low": 0, "high": 1, "shape": [0, 1e20]}, "shape", "integers >= 0"),
        ({"type": "Box", "low": 0, "high": 1, "shape": [-1, 3]}, "shape", "integers >= 0"),
        ({"type": "MultiBinary", "n": 10**12}, "n", "elements"),
    ],
)
def test_huge_or_malformed_space_shapes_are_refused_before_allocating(spec, where, expected):
    """gymnasium allocates a Box's bounds at full shape: a crafted config or checkpoint
    would cost gigabytes before anything else refused it."""
    with pytest.raises(ConfigError, match=expected) as info:
        space_from_spec(spec, "policies.p.observation_space")
    assert f"policies.p.observation_space.{where}" in str(info.value)
