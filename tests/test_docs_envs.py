"""docs/ENVS.md does what it says: every ```python block runs as the script a user
would save it as, and what the prose claims about the results holds."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

from marl_runner import EnvRunner, RunnerConfig, check_batch_invariants, cli

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ENVS.md"
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

# pettingzoo.test imports PettingZoo's own env modules (connect_four_v3, ...), and
# PettingZoo 1.27 warns on each such import in favour of its new pettingzoo.make registry.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The old environment creation API has been deprecated:DeprecationWarning"
)

def doc_blocks(language: str) -> list[str]:
    return [m.group(2) for m in _FENCE.finditer(DOC.read_text()) if m.group(1) == language]


PYTHON = doc_blocks("python")
RACE, NIM, RELAY, REGISTER = PYTHON  # the order of the page; a new block needs a test here


def run_as_script(code: str, path: Path) -> dict:
    """Run `code` as `python path` would: as `__main__`, so `"__main__:Race"` names it."""
    path.write_text(code)
    script = types.ModuleType("__main__")
    script.__file__ = str(path)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = script
    try:
        exec(compile(code, str(path), "exec"), script.__dict__)
    finally:
        sys.modules["__main__"] = saved
    return script.__dict__


@pytest.fixture
def my_envs(tmp_path, monkeypatch) -> Path:
    """The Race block saved as my_envs.py and importable, as the page asks."""
    (tmp_path / "my_envs.py").write_text(RACE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_envs", None)


def test_the_page_has_the_blocks_these_tests_know() -> None:
    assert [len(doc_blocks("python")), len(doc_blocks("yaml"))] == [4, 1]
    assert "class Race(ParallelEnv)" in RACE and "class Nim(AECEnv)" in NIM
    assert "class Relay(MultiAgentEnv)" in RELAY and "register_env(" in REGISTER


def test_parallel_env_block(tmp_path, capsys) -> None:
    script = run_as_script(RACE, tmp_path / "race.py")
    rows = script["batch"].policy_batches["shared"]
    assert len(rows["obs"]) == 2 * 2 * 20  # 2 sub-envs x 2 agents x 20 rounds
    assert rows["truncateds"].sum() == 2 * 2 * 2 and not rows["terminateds"].any()
    assert capsys.readouterr().out == "80 rows, 8 truncated episode ends\n"
    from pettingzoo.test import parallel_api_test

    parallel_api_test(script["Race"](), num_cycles=20)


def test_aec_block_honours_masks_and_credits_the_losers_reward(tmp_path, capsys) -> None:
    script = run_as_script(NIM, tmp_path / "nim.py")
    rows = script["batch"].policy_batches["player"]
    check_batch_invariants(script["batch"])
    assert capsys.readouterr().out.endswith(", 0 masked actions taken\n")
    one_left = np.isclose(rows["obs"][:, 0], 1 / 7)
    assert one_left.any() and (rows["action_mask"][one_left, 1] == 0).all()
    assert (rows["actions"][one_left] == 0).all()
    for eps_id in np.unique(rows["eps_id"]):
        mine = rows["eps_id"] == eps_id
        seats = {
            seat: rows["rewards"][mine & (rows["agent_index"] == seat)].sum() for seat in (0, 1)
        }
        assert sorted(seats.values()) == [-1.0, 1.0]  # the loser's -1 reached its last row
    from pettingzoo.test import api_test

    api_test(script["Nim"](), num_cycles=20)


def test_multi_agent_env_block_spawns_and_ends_agents(tmp_path, capsys) -> None:
    script = run_as_script(RELAY, tmp_path / "relay.py")
    rows = script["batch"].policy_batches["runner"]
    assert capsys.readouterr().out == "32 rows: 4 per agent per episode; 8 ends\n"
    for agent_index in (0, 1):
        mine = rows["agent_index"] == agent_index
        assert sorted(set(rows["t"][mine].tolist())) == [0, 1, 2, 3]
        assert rows["terminateds"][mine].sum() == 4  # one end per episode


def test_register_env_block(my_envs, tmp_path, capsys) -> None:
    run_as_script(REGISTER, tmp_path / "registered.py")
    assert capsys.readouterr().out == "10 env steps\n"


def test_yaml_block_names_the_module(my_envs) -> None:
    [yaml_text] = doc_blocks("yaml")
    (my_envs / "race.yaml").write_text(yaml_text)
    config = RunnerConfig.from_yaml(my_envs / "race.yaml")
    assert config.env["name"] == "my_envs:Race"
    with EnvRunner(config) as runner:
        batch = runner.sample()
    check_batch_invariants(batch)
    assert batch.env_steps() == 40


def test_a_config_saved_with_a_main_name_fails_in_another_program(tmp_path, capsys) -> None:
    config = RunnerConfig.from_dict({"env": {"name": "__main__:Race"}, "policies": {"shared": {}}})
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(config.to_dict()))
    # this process's __main__ is pytest, not a script that defines Race
    assert cli.main(["validate", str(saved)]) == 2
    assert "'__main__:Race'" in capsys.readouterr().err


@pytest.mark.slow
def test_main_name_works_in_the_script_and_its_subprocess_workers(tmp_path) -> None:
    """As the page says: "__main__:Race" in a script, with `vectorize: subprocess`."""
    code = RACE.replace('"name": Race,', '"name": "__main__:Race",').replace(
        '"num_envs": 2,', '"num_envs": 2, "vectorize": "subprocess",'
    )
    assert code.count("__main__:Race") == 1 and code.count('"subprocess"') == 1
    script = tmp_path / "race.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "80 rows, 8 truncated episode ends\n"
