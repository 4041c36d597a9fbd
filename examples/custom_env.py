"""A custom MultiAgentEnv whose agents spawn and die mid-episode, sampled by the runner.

Shows: ``Hive``, written against marl_runner's own ``MultiAgentEnv`` (dicts
keyed by agent, ``"__all__"`` in the done dicts). A queen lives the whole
episode and may spend 2 food to hatch a worker, whose first observation
comes in the output of the round it hatched in; a worker forages (+1 reward when it finds food) until
it starves (terminated, -1) or grows old (terminated); workers still alive
when the time limit hits are truncated. Two policies: ``queen`` and
``worker``. Every agent's info carries ``reward_total``, the reward the env
has handed it so far, so the output can check that the runner's rows add up
to exactly what the env gave each agent, dying ones included.

Run from the repository root:

    python examples/custom_env.py
    marl-runner sample examples/configs/hive.yaml --episodes 20

It prints one episode's agents (policy, rows, first and last ``t``, reward in
the rows, reward the env gave, how it ended) and whether rewards were
conserved for every agent of every sampled episode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs import MultiAgentEnv

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "hive.yaml"

REST, FORAGE = 0, 1  # worker actions
WAIT, HATCH = 0, 1  # queen actions
HATCH_COST = 2
MAX_ENERGY = 6


class Hive(MultiAgentEnv):
    """A queen hatching workers that forage until they starve or grow old.

    Observations are 3 floats in [0, 1]: the queen sees (food, workers alive,
    time); a worker sees (energy, age, food). Foraging costs 1 energy and
    finds food with probability ``find_prob``; resting costs nothing.
    """

    def __init__(
        self,
        max_steps: int = 60,
        max_workers: int = 12,
        lifespan: int = 20,
        find_prob: float = 0.5,
    ) -> None:
        if max_steps < 1 or max_workers < 1 or lifespan < 1 or not 0 <= find_prob <= 1:
            raise ValueError(
                f"Hive(max_steps={max_steps}, max_workers={max_workers}, lifespan={lifespan}, "
                f"find_prob={find_prob}): expected positive counts and find_prob in [0, 1]"
            )
        self.max_steps, self.max_workers = max_steps, max_workers
        self.lifespan, self.find_prob = lifespan, find_prob
        self.possible_agents = ["queen"] + [f"worker_{i}" for i in range(max_workers)]
        box = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self._rng = np.random.default_rng()

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t = 0
        self.food = HATCH_COST
        self.hatched = 0
        self.energy: dict[str, int] = {}
        self.age: dict[str, int] = {}
        self.reward_totals: dict[str, float] = {"queen": 0.0}
        self._hatch()
        agents = ["queen", *self.energy]
        return self._observe(agents), self._infos(agents)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        rewards: dict[str, float] = {}
        terminateds: dict[str, bool] = {}
        for worker in list(self.energy):
            self.age[worker] += 1
            rewards[worker] = 0.0
            if actions[worker] == FORAGE:
                self.energy[worker] -= 1
                if self._rng.random() < self.find_prob:
                    self.food += 1
                    rewards[worker] += 1.0
            if self.energy[worker] == 0:
                rewards[worker] -= 1.0  # starved: the penalty comes with its last obs
                terminateds[worker] = True
            elif self.age[worker] >= self.lifespan:
                terminateds[worker] = True
        rewards["queen"] = 0.1 * len(self.energy)  # colony size this round
        if actions["queen"] == HATCH and self.food >= HATCH_COST:
            self.food -= HATCH_COST
            self._hatch()  # the new worker's first obs is in this round's output
        truncated = self.t >= self.max_steps
        agents = ["queen", *self.energy]
        for agent, reward in rewards.items():
            self.reward_totals[agent] += reward
        obs, infos = self._observe(agents), self._infos(agents)
        for worker in terminateds:
            del self.energy[worker], self.age[worker]
        terminateds = {agent: terminateds.get(agent, False) for agent in agents}
        truncateds = {agent: truncated and not terminateds[agent] for agent in agents}
        terminateds["__all__"], truncateds["__all__"] = False, truncated
        return obs, rewards, terminateds, truncateds, infos

    def _hatch(self) -> None:
        if self.hatched < self.max_workers:
            worker = f"worker_{self.hatched}"
            self.hatched += 1
            self.energy[worker], self.age[worker] = MAX_ENERGY, 0
            self.reward_totals[worker] = 0.0

    def _observe(self, agents: list[str]) -> dict[str, np.ndarray]:
        food = min(self.food / 10.0, 1.0)
        obs = {}
        for agent in agents:
            if agent == "queen":
                values = (food, len(self.energy) / self.max_workers, self.t / self.max_steps)
            else:
                values = (self.energy[agent] / MAX_ENERGY, self.age[agent] / self.lifespan, food)
            obs[agent] = np.array(values, np.float32)
        return obs

    def _infos(self, agents: list[str]) -> dict[str, dict]:
        return {
            agent: {"agent": agent, "reward_total": self.reward_totals[agent]} for agent in agents
        }


def agent_table(batch: Any) -> dict[int, dict[str, dict[str, Any]]]:
    """Per episode and agent: policy, rows, first/last t, reward in the rows, reward the env
    gave (``reward_total`` of its last info) and how it ended."""
    from marl_runner.checks import trajectory_rows

    table: dict[int, dict[str, dict[str, Any]]] = {}
    for policy_id, rows in batch.policy_batches.items():
        for (eps_id, _), index in trajectory_rows(rows).items():
            last = index[-1]
            info = rows["infos"][last]
            ended = (
                "terminated"
                if rows["terminateds"][last]
                else ("truncated" if rows["truncateds"][last] else "running")
            )
            table.setdefault(eps_id, {})[info["agent"]] = {
                "policy": policy_id,
                "rows": len(index),
                "t": (int(rows["t"][index[0]]), int(rows["t"][last])),
                "reward_in_rows": float(rows["rewards"][index].astype(np.float64).sum()),
                "reward_from_env": float(info["reward_total"]),
                "ended": ended,
            }
    return table


def main(argv: list[str] | None = None) -> dict[int, dict[str, dict[str, Any]]]:
    """Samples whole episodes of Hive; returns ``agent_table`` of the batch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--episodes",
        type=int,
        default=6,
        help="at least this many whole episodes: the sub-envs step together and every "
        "episode that ends in the last round counts, so often a few more",
    )
    parser.add_argument("--max-steps", type=int, default=60, help="the episodes' time limit")
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:  # the config names "examples.custom_env:Hive"
        sys.path.insert(0, str(REPO))
    from marl_runner import EnvRunner, RunnerConfig, check_batch_invariants

    config = RunnerConfig.from_yaml(CONFIG).with_overrides(
        ["batch_mode=complete_episodes", f"env.config.max_steps={args.max_steps}"]
    )
    with EnvRunner(config) as runner:
        batch = runner.sample(num_episodes=args.episodes)
    check_batch_invariants(batch)  # t from 0, new_obs[t] == obs[t + 1], flags on last rows only
    table = agent_table(batch)

    eps_id, agents = max(table.items(), key=lambda item: len(item[1]))
    print(f"{len(table)} episodes sampled; the one with most agents ({len(agents)}):")
    print(
        f"{'agent':<10} {'policy':<7} {'rows':>4} {'t':>7} {'reward in rows':>15} "
        f"{'reward from env':>16}  ended"
    )
    for agent, row in agents.items():
        first, last = row["t"]
        print(
            f"{agent:<10} {row['policy']:<7} {row['rows']:4d} {f'{first}-{last}':>7} "
            f"{row['reward_in_rows']:15.2f} {row['reward_from_env']:16.2f}  {row['ended']}"
        )
    conserved = all(
        np.isclose(row["reward_in_rows"], row["reward_from_env"])
        for agents in table.values()
        for row in agents.values()
    )
    num_agents = sum(len(agents) for agents in table.values())
    print(f"rewards conserved for all {num_agents} agents of {len(table)} episodes: {conserved}")
    if not conserved:
        raise SystemExit("rows and env disagree on some agent's reward")
    return table


if __name__ == "__main__":
    main()
