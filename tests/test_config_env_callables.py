"""Issue 21: ``env.name`` may be the env class or function itself in a Python config.

Checked: it survives what a config must do (to_dict / from_dict, checkpoints,
subprocess workers), and YAML, which cannot hold one, says what it expects.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.bench.envs.cheap_env import CheapEnv
from marl_runner.config import ConfigError

REPO = Path(__file__).resolve().parent.parent
CHEAP_PATH = "marl_runner.bench.envs.cheap_env:CheapEnv"


def python_config(env: object, **changes: object) -> dict:
    data = {
        "env": env,
        "num_envs": 2,
        "rollout_fragment_length": 5,
        "policies": {"shared": {"model": {"hidden": [8]}}},
    }
    data.update(changes)
    return data


def test_an_importable_class_is_stored_as_its_import_path() -> None:
    config = RunnerConfig.from_dict(
        python_config({"name": CheapEnv, "config": {"num_agents": 2, "episode_len": 4}})
    )
    assert config.env["name"] == CHEAP_PATH
    assert config.to_dict()["env"] == {
        "name": CHEAP_PATH,
        "config": {"num_agents": 2, "episode_len": 4},
        "api": "auto",
    }
    assert RunnerConfig.from_dict(config.to_dict()) == config
    shorthand = RunnerConfig.from_dict(python_config(CheapEnv))
    assert shorthand.env["name"] == CHEAP_PATH


def test_env_runner_takes_a_dict_with_the_class() -> None:
    data = python_config({"name": CheapEnv, "config": {"num_agents": 3, "episode_len": 4}})
    with EnvRunner(data) as runner:
        batch = runner.sample()
    assert batch.env_steps() == 10 and len(batch.policy_batches["shared"]) == 30


def test_callables_without_a_path_are_registered_with_keyword_arguments() -> None:
    def make(num_agents: int) -> CheapEnv:
        return CheapEnv(num_agents=num_agents, episode_len=3)

    other = lambda **kwargs: CheapEnv(**kwargs)  # noqa: E731
    config = RunnerConfig.from_dict(python_config({"name": make, "config": {"num_agents": 2}}))
    second = RunnerConfig.from_dict(python_config({"name": other}))
    name = config.env["name"]
    assert name.startswith(f"{__name__}.test_callables_without_a_path") and "<locals>" in name
    assert second.env["name"] != name and "<lambda>" in second.env["name"]
    with EnvRunner(config) as runner:  # the registered creator calls make(**env.config)
        assert runner.sample().env_steps() == 10


@pytest.mark.parametrize("name", [3, "", ["a:b"]])
def test_yaml_cannot_name_an_env_with_anything_but_a_string(tmp_path: Path, name: object) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"env: {{name: {name!r}}}\npolicies: {{shared: {{}}}}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        RunnerConfig.from_yaml(path)
    assert info.value.key == "env.name"
    assert "'module:callable'" in str(info.value) and "Python config" in str(info.value)


SCRIPT = """
    import sys
    from marl_runner import EnvRunner, RunnerConfig, restore_checkpoint, save_checkpoint
    from marl_runner.bench.envs.cheap_env import CheapEnv


    class Hive(CheapEnv):  # defined in __main__: no import path
        def __init__(self, queens: int = 1, workers: int = 2) -> None:
            super().__init__(num_agents=queens + workers, episode_len=4)


    if __name__ == "__main__":
        config = RunnerConfig.from_dict({
            "env": {"name": Hive, "config": {"workers": 3}},
            "num_envs": 2, "vectorize": "subprocess", "num_workers": 2,
            "rollout_fragment_length": 4, "policies": {"shared": {"model": {"hidden": [8]}}},
        })
        assert config.to_dict()["env"]["name"] == "__main__.Hive", config.env
        with EnvRunner(config) as runner:  # the workers unpickle Hive from __main__
            assert len(runner.sample().policy_batches["shared"]) == 2 * 4 * 4
            save_checkpoint(runner, sys.argv[1])
        with restore_checkpoint(sys.argv[1]) as restored:  # registered: data, no trust needed
            assert restored.config.env == config.env
            assert restored.sample().env_steps() == 8
        print("OK")
"""


@pytest.mark.slow  # a fresh interpreter with torch and two forkserver workers: ~20 s loaded
def test_a_class_from_main_works_with_subprocess_workers_and_checkpoints(tmp_path: Path) -> None:
    script = tmp_path / "hive_script.py"
    script.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    checkpoint = tmp_path / "hive.ckpt"
    result = subprocess.run(
        [sys.executable, str(script), str(checkpoint)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr
    fresh = RunnerConfig.from_dict(python_config("__main__.Hive"))  # loads: a registered name
    with pytest.raises(Exception, match=r"__main__\.Hive.*not a registered env"):
        EnvRunner(fresh)
