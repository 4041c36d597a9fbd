"""An agent that never acts (a poker player whose opponent folds first) has no batch row,
the one exception to "per (episode, agent) the batch sums equal what the env gave", and its
reward still counts in the metrics under the policy it maps to."""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from marl_runner import Callbacks, EnvRunner, RunnerConfig

pytest.importorskip("rlcard", reason="PettingZoo's leduc_holdem needs rlcard (the dev extra)")

LEDUC = "pettingzoo.classic.leduc_holdem_v4:env"
MODULE = "tests.test_runner_never_acting_agents"


class RecordRewards(Callbacks):
    """What the env gave each agent, per episode, and which agents ever observed."""

    given: dict[int, dict[Any, float]] = {}
    observed: dict[int, set] = {}

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        totals = {agent: reward for (agent, _), reward in episode.agent_rewards.items()}
        RecordRewards.given[episode.episode_id] = totals
        RecordRewards.observed[episode.episode_id] = set(episode.get_agents())


def test_leduc_rows_and_metrics_around_agents_that_never_act(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, MODULE, sys.modules[__name__])  # the config names it
    config = RunnerConfig.from_dict(
        {
            "env": {"name": LEDUC},
            "num_envs": 4,
            "batch_mode": "complete_episodes",
            "policies": {"shared": {}},
            "callbacks": f"{MODULE}:RecordRewards",
            "seed": 3,
        }
    )
    with EnvRunner(config) as runner:
        batch = runner.sample(num_episodes=120)
        metrics = runner.get_metrics()
    rows = batch.policy_batches["shared"]
    in_rows: dict[int, dict[Any, float]] = defaultdict(lambda: defaultdict(float))
    for eps_id, agent, reward in zip(rows["eps_id"], rows["agent_id"], rows["rewards"]):
        in_rows[int(eps_id)][str(agent)] += float(reward)
    never_acted = 0
    for eps_id, agents in in_rows.items():
        given = RecordRewards.given[eps_id]
        for agent, total in agents.items():
            assert total == pytest.approx(given[agent])  # every reward of an agent with rows
        silent = set(given) - set(agents)
        assert silent == set(given) - RecordRewards.observed[eps_id]  # only never-observers
        never_acted += bool(silent)
    assert never_acted > 0  # the exception happened, so the metric below was tested
    # Zero-sum: every episode's rewards add up to 0, so a shared policy's mean is 0 only if
    # the agents that never acted count too.
    assert sum(sum(g.values()) for g in RecordRewards.given.values()) == pytest.approx(0.0)
    assert metrics["policy_reward_mean"]["shared"] == pytest.approx(0.0, abs=1e-9)
    assert np.isfinite(metrics["episode_reward_mean"])
