"""The ``vectorize`` backend registry: built-ins built through it, a toy backend end to end,
its keys in the config and the reference, and ``num_envs_per_poll``."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from marl_runner import EnvRunner, check_batch_invariants
from marl_runner.cli import main
from marl_runner.config import ConfigError, RunnerConfig
from marl_runner.config.reference import render
from marl_runner.envs import (
    EnvError,
    SubprocessVectorEnv,
    SyncVectorEnv,
    make_vector_env,
    vector_backends,
)
from marl_runner.envs.external_vector_env import ExternalVectorEnv
from marl_runner.envs.vector_backends import (
    VectorBuild,
    VectorKey,
    int_check,
    register_vector_backend,
    vector_backend_names,
)
from marl_runner.envs.vectorize import STEP_TIMEOUT

CHEAP = {"name": "marl_runner.bench.envs:CheapEnv", "config": {"num_agents": 2}}
THREADED = "marl_runner.bench.envs.external_envs:ThreadedExternalEnv"
SPREAD = "mpe2.simple_spread_v3:parallel_env"
BUILT: list[VectorBuild] = []
TOY_REPEATS = VectorKey(
    "toy_repeats", 1, "toy: how many times the toy backend says hello.", int_check(1)
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def build_toy(build: VectorBuild) -> SyncVectorEnv:
    """A backend of its own: records what it was given, steps the sub-envs in this process."""
    BUILT.append(build)
    return SyncVectorEnv(build.factory, build.num_envs, seed=build.seed)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backends registered in a test are gone after it."""
    monkeypatch.setattr(vector_backends, "_BACKENDS", dict(vector_backends._BACKENDS))
    BUILT.clear()


@pytest.fixture
def toy(registry: None) -> None:
    register_vector_backend(
        "toy", build_toy, doc="A toy backend of a test.", keys=(TOY_REPEATS, STEP_TIMEOUT)
    )


def spread_config(**overrides: Any) -> RunnerConfig:
    return RunnerConfig.from_dict(
        {
            "env": {"name": SPREAD, "config": {"N": 2, "max_cycles": 15}},
            "num_envs": 2,
            "rollout_fragment_length": 10,
            "policies": {"shared": {"model": {"type": "mlp", "hidden": [8]}}},
            **overrides,
        }
    )


# ----------------------------------------------------------------------------- the built-ins


def test_sync_and_subprocess_build_through_the_registry() -> None:
    assert vector_backend_names()[:4] == ("sync", "subprocess", "ray", "external")
    assert isinstance(make_vector_env({"env": CHEAP, "num_envs": 2}), SyncVectorEnv)
    config = {"env": CHEAP, "num_envs": 3, "vectorize": "subprocess", "num_workers": 3}
    with make_vector_env({**config, "num_envs_per_poll": 2, "pin_workers": False}) as vec:
        assert isinstance(vec, SubprocessVectorEnv) and vec.num_envs_per_poll == 2
    with make_vector_env({**config, "async_poll": True}) as vec:
        assert vec.num_envs_per_poll == 1 and vec.async_poll


def test_external_builds_through_the_registry() -> None:
    vec = make_vector_env(
        {
            "env": {"name": THREADED},
            "num_envs": 2,
            "vectorize": "external",
            "external_episode_timeout_s": 5.0,
            "remote_env_batch_wait_ms": 20,
        }
    )
    assert isinstance(vec, ExternalVectorEnv) and vec.num_envs == 2
    assert vec.board.episode_timeout_s == 5.0 and vec.board.batch_wait_s == pytest.approx(0.02)
    vec.stop()


@pytest.mark.slow
def test_ray_builds_through_the_registry_with_num_envs_per_poll(ray_local: Any) -> None:
    config = {"env": CHEAP, "num_envs": 3, "vectorize": "ray"}
    for extra, per_poll in (({}, 1), ({"num_envs_per_poll": 3}, 3), ({"async_poll": True}, 1)):
        vec = make_vector_env({**config, **extra})
        try:
            assert type(vec).__name__ == "RayVectorEnv" and vec.num_envs_per_poll == per_poll
        finally:
            vec.stop()
    with pytest.raises(EnvError, match="async_poll and num_envs_per_poll=2 both given"):
        make_vector_env({**config, "async_poll": True, "num_envs_per_poll": 2})


def test_registering_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, marl_runner.config\n"
        "from marl_runner.envs.vector_backends import register_vector_backend, vector_keys\n"
        "register_vector_backend('mine', print, doc='', keys=tuple(vector_keys().values()))\n"
        "print(sorted({'ray', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ----------------------------------------------------------------------------- unknown names


def test_an_unknown_vectorize_lists_the_registered_backends() -> None:
    with pytest.raises(EnvError) as caught:
        make_vector_env({"env": CHEAP, "vectorize": "subproces"})
    assert str(caught.value) == (
        "vectorize 'subproces': expected one of ['sync', 'subprocess', 'ray', 'external'] "
        "(did you mean 'subprocess'?)"
    )
    with pytest.raises(ConfigError) as caught:
        spread_config(vectorize="rays")
    assert caught.value.key == "vectorize"
    assert "'sync', 'subprocess', 'ray', 'external'" in caught.value.problem
    assert "did you mean 'ray'?" in caught.value.problem


def test_a_registered_backend_is_a_valid_choice_at_once(toy: None) -> None:
    with pytest.raises(ConfigError, match="did you mean 'toy'"):
        spread_config(vectorize="tyo")
    assert spread_config(vectorize="toy").vectorize == "toy"


# ----------------------------------------------------------------------------- a toy backend


def test_a_toy_backend_runs_end_to_end_through_env_runner(toy: None) -> None:
    config = spread_config(vectorize="toy", toy_repeats=3, sub_env_step_timeout_s=None, seed=4)
    assert config.toy_repeats == 3 and config.to_dict()["toy_repeats"] == 3
    assert RunnerConfig.from_dict(config.to_dict()) == config
    with EnvRunner(config) as runner:
        for index in range(2):
            batch = runner.sample()
            check_batch_invariants(batch, t_from_zero=index == 0, rollout_fragment_length=10)
    (build,) = BUILT
    assert build.num_envs == 2 and build.seed == 4
    assert build.options == {"toy_repeats": 3, "sub_env_step_timeout_s": None}


def test_a_toy_backends_key_is_checked_and_documented(toy: None) -> None:
    with pytest.raises(ConfigError) as caught:
        spread_config(vectorize="toy", toy_repeats=0)
    assert str(caught.value) == "toy_repeats: got 0, expected an integer >= 1"
    with pytest.raises(ConfigError, match=r"toy_repeat: unknown key \(did you mean 'toy_repeats'"):
        spread_config(toy_repeat=2)
    text = render()
    assert "| `toy_repeats` | `1` | toy: how many times the toy backend says hello. |" in text
    assert "| `toy` | A toy backend of a test. | `toy_repeats`, `sub_env_step_timeout_s` |" in text


def test_validate_builds_the_backends_stand_in(toy: None, tmp_path: Any, capsys: Any) -> None:
    """`marl-runner validate` builds sync for most backends, with one sub-env, never the real one."""
    path = tmp_path / "toy.yaml"
    data = spread_config(vectorize="toy").to_dict()
    path.write_text(yaml.safe_dump({**data, "env": {"name": SPREAD}}), encoding="utf-8")
    assert main(["validate", str(path)]) == 0
    assert BUILT == []
    register_vector_backend(
        "toy", build_toy, doc="Built by validate too.", keys=(TOY_REPEATS,), validate_with="toy"
    )
    assert main(["validate", str(path)]) == 0
    assert [build.num_envs for build in BUILT] == [1]
    capsys.readouterr()


def test_registration_errors_name_the_problem(registry: None) -> None:
    with pytest.raises(EnvError, match="builder 3 is not callable"):
        register_vector_backend("bad", 3, doc="")  # type: ignore[arg-type]
    with pytest.raises(EnvError, match="validate_with 'nope'"):
        register_vector_backend("bad", build_toy, doc="", validate_with="nope")
    other = VectorKey("sub_env_step_timeout_s", 5.0, "another text", int_check(1))
    with pytest.raises(EnvError, match="'sub_env_step_timeout_s' is already registered by"):
        register_vector_backend("bad", build_toy, doc="", keys=(other,))
    assert "bad" not in vector_backend_names()
    seed_key = VectorKey("seed", 0, "clashes with the top-level seed", int_check(0))
    register_vector_backend("clash", build_toy, doc="", keys=(seed_key,))
    with pytest.raises(ConfigError, match="seed: is a top-level config key and also a key"):
        spread_config()


# ----------------------------------------------------------------------------- num_envs_per_poll


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_envs_per_poll": 0}, "num_envs_per_poll: got 0, expected an integer >= 1, or null"),
        ({"num_envs_per_poll": 2.0}, "num_envs_per_poll: got 2.0, expected an integer >= 1, or null"),
        ({"num_envs_per_poll": True}, "num_envs_per_poll: got True, expected an integer >= 1, or null"),
        (
            {"vectorize": "subprocess", "num_envs_per_poll": 3},
            "num_envs_per_poll: got 3, expected an integer in [1, num_envs=2], or null",
        ),
        (
            {"vectorize": "ray", "num_envs_per_poll": 3},
            "num_envs_per_poll: got 3, expected an integer in [1, num_envs=2], or null",
        ),
        (
            {"vectorize": "subprocess", "num_envs_per_poll": 2, "async_poll": True},
            "num_envs_per_poll: got 2 with async_poll: true, which is short for "
            "num_envs_per_poll: 1; set one of them",
        ),
    ],
)
def test_bad_num_envs_per_poll_is_named(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spread_config(**overrides)
    assert str(caught.value) == message


def test_num_envs_per_poll_defaults_to_null_and_reaches_the_backend() -> None:
    assert spread_config().num_envs_per_poll is None
    assert spread_config(vectorize="sync", num_envs_per_poll=8).num_envs_per_poll == 8  # unread
    config = spread_config(vectorize="subprocess", num_workers=2, num_envs_per_poll=1)
    assert spread_config(vectorize="subprocess", async_poll=True).async_poll
    with EnvRunner(config) as runner:
        assert runner.env.num_envs_per_poll == 1
        check_batch_invariants(runner.sample(), rollout_fragment_length=10)
