"""The least-work loop (``marl-runner bench --least-work``): it keeps every row it acts on,
puts them in trajectory order, and reports beside the runner and the bare loop."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marl_runner import RunnerConfig
from marl_runner.bench.cli import main
from marl_runner.bench.least_work import LeastWorkLoop, _Store


def _cheap(num_agents: int = 4, episode_len: int = 5, fragment: int = 10) -> RunnerConfig:
    return RunnerConfig.from_dict({
        "env": {
            "name": "marl_runner.bench.envs.cheap_env:CheapEnv", "api": "multi_agent",
            "config": {"num_agents": num_agents, "episode_len": episode_len},
        },
        "num_envs": 2,
        "rollout_fragment_length": fragment,
        "policies": {"even": {}, "odd": {}},
        "policy_mapping_fn": {"agent_*[02468]": "even", "agent_*": "odd"},
        "seed": 1,
    })


def test_every_row_acted_on_or_ending_goes_into_a_batch() -> None:
    """2 sub-envs of 4 agents, episodes of 5 rounds, batches every 10 rounds: each action
    sent is a row, and so is each agent's last obs (acted on by nobody)."""
    loop = LeastWorkLoop(_cheap())
    try:
        result = loop.run(min_rounds=20)
    finally:
        loop.stop()
    assert result.rounds == 20 and result.episodes > 0
    assert loop.rows_built == result.agent_steps + 4 * result.episodes
    assert result.agent_steps == 20 * 2 * 4  # every agent acts every round


def test_the_store_pairs_each_row_with_the_next_of_its_trajectory() -> None:
    """Rows stay where they were stored (as the runner hands them out); the closing side of
    each (new_obs, the reward and flags that came with it) is its trajectory's next row's."""
    store = _Store()
    keys = [3, 1, 3, 0, 1, 3]
    store.add(
        {
            "obs": np.arange(6.0)[:, None],
            "rewards": np.arange(10.0, 16.0),
            "terminateds": np.array([0, 0, 0, 0, 0, 1], bool),
            "truncateds": np.zeros(6, bool),
        },
        keys,
        list("abcdef"),
    )
    batch = store.build()
    assert batch["obs"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    # key 3: rows 0 -> 2 -> 5; key 1: 1 -> 4; key 0: row 3 alone (its own next).
    assert batch["new_obs"][:, 0].tolist() == [2.0, 4.0, 5.0, 3.0, 4.0, 5.0]
    assert batch["rewards"].tolist() == [12.0, 14.0, 15.0, 13.0, 14.0, 15.0]
    assert batch["terminateds"].tolist() == [False, False, True, False, False, True]
    assert batch["infos"] == list("abcdef")
    assert store.size == 0 and not store.keys


def test_bench_least_work_reports_its_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke", "--json", "--least-work", "cheap", "connect_four", "battle"]) == 0
    report = json.loads(capsys.readouterr().out)
    for row in report["workloads"]:
        assert row["least_work"]["agent_steps_per_s"] > 0
        assert row["least_work_ratio"] == pytest.approx(
            row["least_work"]["agent_steps_per_s"] / row["bare"]["agent_steps_per_s"]
        )


def test_bench_least_work_refuses_the_torch_bare_loop(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="--least-work runs the numpy forward pass"):
        main(["--smoke", "--least-work", "--bare-forward", "torch", "cheap"])
