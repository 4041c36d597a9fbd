"""Hostile configs: YAML depth and alias expansion are limited, and every message shows a
value shortened, never a whole (expanded) config.
"""

from __future__ import annotations

import os

import pytest
from helpers_bounded import run_capped

from marl_runner.cli.app import main
from marl_runner.config import ConfigError, RunnerConfig
from marl_runner.config.runner_config import MAX_CONFIG_BYTES
from marl_runner.config.schema import POLICY_KEYS
from marl_runner.config.yaml_form import MAX_YAML_CHARS, MAX_YAML_DEPTH, MAX_YAML_NODES
from marl_runner.envs import register_env
from marl_runner.envs.errors import EnvError
from marl_runner.envs.registry import make_env

HEAD = "policies: {shared: {}}\nenv:\n  name: pettingzoo.classic.tictactoe_v3:env\n"


def alias_bomb(levels: int = 9) -> str:
    """Each level lists the one before nine times: 9**levels nodes once expanded."""
    lines = ["  config:", '    a0: &a0 ["xxxxxxxx"]']
    for i in range(1, levels + 1):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return HEAD + "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return HEAD + "  config:\n    deep: " + "[" * depth + "]" * depth + "\n"


def test_deep_yaml_is_a_one_line_error(tmp_path, capsys):
    """Case 9: env.config nested 3,000 deep was a 2,999-line RecursionError traceback."""
    path = tmp_path / "deep.yaml"
    path.write_text(nested(3000))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(path) in err and f"more than {MAX_YAML_DEPTH} levels" in err and "line 5" in err


def test_yaml_within_the_depth_limit_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(nested(MAX_YAML_DEPTH - 4))
    assert RunnerConfig.from_yaml(path).env["config"]["deep"]


@pytest.mark.parametrize("command", ["validate", "sample"])
def test_an_alias_bomb_is_refused_while_parsing(tmp_path, command):
    """Case 10: 1.2 KB of YAML aliases expanding to 9**9 nodes under env.config made
    validate run 70 s and reach 5.9 GB, printing the expanded config in its error."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size < 1500
    result = run_capped(
        f"""
        from marl_runner.cli.app import main
        print("EXIT", main([{command!r}, {str(path)!r}]))
        """,
        cap_mib=1536,
        timeout_s=60,
    )
    assert result.stdout.splitlines()[-1] == "EXIT 2", result.stderr[-2000:]
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and len(err) < 400
    assert "aliases" in err and f"{MAX_YAML_NODES:,}" in err
    assert result.peak_rss_mib < 600


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text(HEAD + "  config:\n    loop: &loop [*loop]\n")
    with pytest.raises(ConfigError, match="refers to itself"):
        RunnerConfig.from_yaml(path)


def test_aliases_of_a_long_string_are_refused_by_the_characters_they_expand_to(tmp_path):
    """50,000 aliases of one 1 MB string passed validate; sample then spent hours writing
    the expanded config.yaml, and a checkpoint of it raised a bare MemoryError."""
    path = tmp_path / "long.yaml"
    refs = ", ".join(["*s"] * 50)
    path.write_text(HEAD + f"  config:\n    s: &s {'x' * 100_000}\n    many: [{refs}]\n")
    with pytest.raises(ConfigError, match=f"aliases expand to more than {MAX_YAML_CHARS:,} char"):
        RunnerConfig.from_yaml(path)


@pytest.mark.parametrize("key", ["? [1, 2]\n  : 3", "? {a: 1}\n  : 3"])
def test_a_mapping_key_that_is_a_list_or_a_mapping_is_a_yaml_error(tmp_path, key):
    """It was a TypeError traceback (unhashable type)."""
    path = tmp_path / "key.yaml"
    path.write_text(HEAD + f"  {key}\n")
    with pytest.raises(ConfigError, match="found a key that is a list or a mapping"):
        RunnerConfig.from_yaml(path)


def test_a_few_aliases_and_merge_keys_still_load(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text(
        "env: pettingzoo.classic.tictactoe_v3:env\n"
        "policies:\n  a: &base {model: {hidden: [8]}}\n  b: {<<: *base}\n"
        "policy_mapping_fn: {player_1: a, player_2: b}\n"
    )
    config = RunnerConfig.from_yaml(path)
    assert config.policies["b"]["model"]["hidden"] == [8]


def test_override_values_are_bounded_too():
    config = RunnerConfig.from_dict({"env": "x:y", "policies": {"p": {}}})
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_DEPTH} levels"):
        config.with_overrides(["env.config.deep=" + "[" * 1000 + "]" * 1000])


def test_errors_show_values_shortened():
    """A bad value is shown cut short: a 10,000-element list is not printed whole."""
    big = list(range(10_000))
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_dict({"env": "x:y", "policies": {"p": {}}, "num_envs": big})
    assert "num_envs" in str(info.value) and len(str(info.value)) < 300
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_dict({"env": {"name": "x:y", "config": big}, "policies": {"p": {}}})
    assert "env.config" in str(info.value) and len(str(info.value)) < 300


def refuse(config):
    raise TypeError("unexpected keyword")


register_env("bounded-refusing", refuse)


def test_the_env_constructor_error_shows_the_config_shortened():
    config = {"layout": [[0] * 100 for _ in range(100)], "name": "x" * 5000}
    with pytest.raises(EnvError) as info:
        make_env({"name": "bounded-refusing", "config": config})
    message = str(info.value)
    assert "bounded-refusing" in message and "unexpected keyword" in message
    assert "layout" in message and len(message) < 400


def test_a_config_path_that_is_no_regular_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(ConfigError, match="not a regular file \\(a FIFO\\)"):
        RunnerConfig.from_yaml(fifo)
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")  # endless bytes
    with pytest.raises(ConfigError, match="not a regular file \\(a character device\\)"):
        RunnerConfig.from_yaml(link)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match="more than the 4,194,304 accepted"):
        RunnerConfig.from_yaml(big)


HUGE = "9" * 5000  # past Python's 4,300 digits for int(str)


def test_an_integer_too_long_for_python_is_a_config_error(tmp_path, capsys):
    """A 5,000-digit int in the file or in --set was a ValueError traceback (exit 1)."""
    path = tmp_path / "huge.yaml"
    path.write_text(HEAD + f"num_envs: {HUGE}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and "5,000 characters" in err and len(err) < 400
    config = RunnerConfig.from_dict({"env": "x:y", "policies": {"p": {}}})
    with pytest.raises(ConfigError, match="num_envs: .*5,000 characters"):
        config.with_overrides([f"num_envs={HUGE}"])


def test_a_batch_too_big_for_a_float_is_refused_by_name(tmp_path, capsys):
    """num_envs of 400 digits: the refusal's own message raised OverflowError."""
    path = tmp_path / "wide.yaml"
    path.write_text(HEAD + f"num_envs: {'9' * 400}\nrollout_fragment_length: {'9' * 4000}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "num_envs ~10^400 x rollout_fragment_length ~10^4000" in err and len(err) < 400


def test_a_negative_seed_is_refused_by_validate_not_by_the_envs_reset():
    """It passed validate, then failed in numpy inside a sub-env's reset (some envs took it)."""
    with pytest.raises(ConfigError, match="^seed: got -1, expected an integer >= 0"):
        RunnerConfig.from_dict({"env": "x:y", "policies": {"p": {}}, "seed": -1})
    assert RunnerConfig.from_dict({"env": "x:y", "policies": {"p": {}}, "seed": 0}).seed == 0


@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [
        ("sub_env_step_timeout_s", 1e11, "at most 1,000,000 s; null waits forever"),
        ("sub_env_step_timeout_s", float("inf"), "at most 1,000,000 s"),
        ("external_episode_timeout_s", 10**12, "at most 1,000,000 s"),
        ("remote_env_batch_wait_ms", 1e10, "at most 1,000,000,000 ms"),
        ("torch_threads", int("9" * 4000), "an integer >= 1 and <= 1,024"),
        ("num_runners", int("9" * 100), "an integer >= 0 and <= 10,000"),
    ],
)
def test_numbers_that_reach_the_os_or_torch_are_bounded(key, value, bound):
    """1e11 s passed validate and then ended sample with 'timestamp too large'; 4,000-digit
    torch_threads failed to build naming no key, 100-digit num_runners failed in Ray."""
    data = {"env": "x:y", "policies": {"p": {}}, "vectorize": "subprocess", key: value}
    with pytest.raises(ConfigError, match=f"^{key}: got .*expected {bound}"):
        RunnerConfig.from_dict(data)
    within = {"torch_threads": 1024, "num_runners": 10_000}.get(
        key, 1_000_000 * (1000 if key.endswith("_ms") else 1)
    )
    assert getattr(RunnerConfig.from_dict(data | {key: within}), key) == within


@pytest.mark.parametrize(
    ("model", "key", "words"),
    [
        ({"hidden": [12000, 12000]}, "hidden", "at least 288,096,002 weights"),
        ({"hidden": [10**8, 10**8]}, "hidden", "at most 65,536"),
        ({"type": "lstm", "lstm_cell_size": 4000}, "lstm_cell_size", "at least 65,064,130"),
        ({"type": "cnn", "conv": [[2, 100_000, 1]]}, "conv", "at most 65,536"),
        ({"hidden": [1] * 65}, "hidden", "got 65 layers, expected at most 64"),
        ({"type": "cnn", "conv": [[1, 1, 1]] * 65}, "conv", "got 65 layers"),
        ({"type": "cnn", "conv": [[60_000, 1, 1]], "hidden": [900]}, "conv", "108,243,602"),
    ],
)
def test_a_model_too_big_is_refused_when_the_config_loads(model, key, words):
    """hidden [12000, 12000] made validate build 3 GB of weights for 2 minutes, then say OK;
    [1e8, 1e8] was a torch allocator error naming no key; 20,000 one-wide layers took
    485 MB."""
    data = {"env": "x:y", "policies": {"p": {"model": model}}}
    with pytest.raises(ConfigError, match=f"^policies.p.model.{key}: .*{words}"):
        RunnerConfig.from_dict(data)


@pytest.mark.parametrize(
    "model",
    [
        {"type": "mlp"},
        {"type": "mlp", "hidden": [30, 20, 5], "vf_share_layers": True},
        {"type": "lstm", "hidden": [7, 3], "lstm_cell_size": 9},
        {"type": "cnn"},
        {"type": "cnn", "conv": [[4, 3, 2], [5, 2, 1]], "hidden": [6]},
    ],
)
def test_the_weights_counted_are_those_the_model_builds(model):
    """The count the size check uses equals the built model's, for one obs value, one output
    and the least image: built on torch's meta device, which allocates nothing."""
    torch = pytest.importorskip("torch")
    from marl_runner.config.policy_checks import model_weights_floor
    from marl_runner.policy.models import NATURE_CONV, build_model

    side = 1
    for _, kernel, stride in reversed(model.get("conv", NATURE_CONV)):
        side = (side - 1) * stride + kernel
    with torch.device("meta"):
        built = build_model(model, 1, 1, obs_shape=(side, side, 1))
    assert model_weights_floor(model) == sum(p.numel() for p in built.parameters())


def test_a_model_too_big_for_the_envs_observations_is_refused_before_it_is_built():
    """A cnn on a 3,000 x 3,000 frame (a config resize) would have 4.6 billion weights:
    torch's allocator failed after gigabytes, naming nothing. Counted on the meta device,
    it is refused at once, with the count and the observation's shape."""
    import gymnasium as gym
    import numpy as np

    from marl_runner.policy import TorchPolicy
    from marl_runner.policy.models import MAX_BUILT_MODEL_PARAMETERS

    model = {"type": "cnn", "conv": [[16, 8, 4]], "hidden": [256]}
    big = gym.spaces.Box(0, 255, (3000, 3000, 1), np.uint8)
    actions = gym.spaces.Discrete(3)
    with pytest.raises(ValueError, match=r"cnn model would have 4,595,723,812 weights for obs"):
        TorchPolicy(big, actions, {"model": model})
    fits = gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)
    policy = TorchPolicy(fits, actions, {"model": model})
    assert sum(p.numel() for p in policy.parameters()) < MAX_BUILT_MODEL_PARAMETERS
    assert f"at most {MAX_BUILT_MODEL_PARAMETERS:,}" in POLICY_KEYS["model"]  # the reference

@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"policies": {"p": {"model": {"type": []}}}}, r"^policies.p.model.type: got \[\]"),
        ({"policies": {"p": {}}, "policy_mapping_fn": {"a*": ["p"]}},
         r"^policy_mapping_fn.a\*: maps to unknown policy id \['p'\]"),
        ({"policies": {"p": {"observation_space": {"type": "Discrete", "n": 2**70}}}},
         r"^policies.p.observation_space: invalid Discrete space .* too large"),
    ],
)
def test_values_of_odd_types_are_config_errors_naming_the_key(data, words):
    """They were bare TypeErrors (unhashable type) and an OverflowError."""
    with pytest.raises(ConfigError, match=words):
        RunnerConfig.from_dict({"env": "x:y", **data})


def test_more_worker_processes_than_memory_holds_is_a_one_line_error(tmp_path, capsys):
    """num_workers: 100000 passed validate, and sample would start that many interpreters."""
    path = tmp_path / "workers.yaml"
    path.write_text(
        HEAD + "vectorize: subprocess\nnum_workers: 100000\nnum_envs: 100000\n"
        "rollout_fragment_length: 1\n"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "num_workers: 100,000 worker processes" in err and "use fewer workers" in err
