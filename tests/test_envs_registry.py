"""make_env / register_env: names, import paths, API detection and error messages."""

from __future__ import annotations

import pytest
from pettingzoo.classic import tictactoe_v3

from marl_runner.envs import (
    AECPettingZooEnv,
    EnvError,
    MultiAgentEnv,
    ParallelPettingZooEnv,
    make_env,
    register_env,
)
from tests.envs import CheapEnv

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize(
    ("name", "config", "wrapper"),
    [
        ("pettingzoo.classic.tictactoe_v3:env", {}, AECPettingZooEnv),
        ("pettingzoo.classic.tictactoe_v3:raw_env", {}, AECPettingZooEnv),
        (
            "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
            {"obs_method": "vector", "max_cycles": 20},
            ParallelPettingZooEnv,
        ),
        ("mpe2.simple_spread_v3:parallel_env", {"N": 2}, ParallelPettingZooEnv),
        ("marl_runner.bench.envs:CheapEnv", {"num_agents": 3}, CheapEnv),
    ],
)
def test_import_paths_are_detected_and_wrapped(name, config, wrapper):
    env = make_env({"name": name, "config": config, "api": "auto"})
    assert isinstance(env, wrapper)
    obs, infos = env.reset(seed=0)
    assert obs and isinstance(infos, dict)


def test_mpe_kwargs_reach_the_callable():
    env = make_env({"name": "mpe2.simple_spread_v3:parallel_env", "config": {"N": 2}})
    assert len(env.possible_agents) == 2


def test_explicit_api_wraps_or_complains():
    assert isinstance(
        make_env({"name": "pettingzoo.classic.tictactoe_v3:env", "api": "aec"}), AECPettingZooEnv
    )
    with pytest.raises(EnvError, match=r"env.api 'parallel' expects .*ParallelEnv.*got a"):
        make_env({"name": "pettingzoo.classic.tictactoe_v3:env", "api": "parallel"})
    with pytest.raises(EnvError, match=r"env.api 'multi_agent' expects .*MultiAgentEnv"):
        make_env({"name": "mpe2.simple_spread_v3:parallel_env", "api": "multi_agent"})


def test_register_env_passes_the_config_dict():
    received = []

    def creator(config):
        received.append(config)
        return CheapEnv(**config)

    register_env("test-cheap", creator)
    env = make_env({"name": "test-cheap", "config": {"num_agents": 2}})
    assert received == [{"num_agents": 2}] and env.possible_agents == ["agent_0", "agent_1"]
    register_env("test-ttt", lambda config: tictactoe_v3.env())
    assert isinstance(make_env({"name": "test-ttt"}), AECPettingZooEnv)


@pytest.mark.parametrize(
    ("env_config", "message"),
    [
        (
            {"name": "foo.bar:baz"},
            r"env.name 'foo.bar:baz': module 'foo.bar' could not be imported: No module named 'foo'",
        ),
        ({"name": "nosuchenv"}, r"'nosuchenv': not a registered env .*'module:callable'"),
        (
            {"name": "pettingzoo.classic.tictactoe_v3:nope"},
            r"'pettingzoo.classic.tictactoe_v3' has no attribute 'nope'",
        ),
        ({"name": "math:pi"}, r"is not callable; expected an env class or function"),
        ({"name": "builtins:dict"}, r"returned a dict; expected a marl_runner MultiAgentEnv"),
        (
            {"name": "marl_runner.bench.envs:CheapEnv", "config": {"bogus": 1}},
            r"creating the env with config \{'bogus': 1\} failed with TypeError",
        ),
        ({"name": "marl_runner.bench.envs:CheapEnv", "api": "gym"}, r"env.api 'gym'.*'auto'"),
        ({"name": "marl_runner.bench.envs:CheapEnv", "config": [1]}, r"expected a mapping"),
        ({"name": "marl_runner.bench.envs:CheapEnv", "nmae": 1}, r"unknown keys \['nmae'\]"),
        ({"config": {}}, r"env.name None: expected a registered env name"),
    ],
)
def test_bad_env_configs_name_the_problem(env_config, message):
    with pytest.raises(EnvError, match=message):
        make_env(env_config)


def test_env_error_is_a_value_error():
    assert issubclass(EnvError, ValueError)
    with pytest.raises(ValueError):
        make_env({"name": ""})


def test_register_env_validates():
    with pytest.raises(EnvError, match="not callable"):
        register_env("x", 3)
    with pytest.raises(EnvError, match="without ':'"):
        register_env("a:b", CheapEnv)


def test_attribute_style_config_and_multi_agent_env_as_is():
    class EnvSection:
        name = "tests.envs:DyingAgentsEnv"
        config = None
        api = "multi_agent"

    env = make_env(EnvSection())
    assert isinstance(env, MultiAgentEnv) and type(env).__name__ == "DyingAgentsEnv"
