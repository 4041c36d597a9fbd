"""A scripted simple_spread controller, and one evaluation for it, random and trained policies.

``GreedySpreadPolicy`` is the reference line for the trained policies of
docs/TRAINING.md: each agent takes its own landmark and steers straight to it.
Every agent sees its own absolute position and the others' and the landmarks'
positions relative to it, so each one can work out the same thing alone: the
assignment of agents to landmarks with the least total distance (all N!
permutations; N is 3). It then picks, among its 5 moves, the one whose
predicted resting point (velocity damped by 0.25 per step, then coasting) is
nearest to its landmark, which brakes before it overshoots. No learning, no
communication, no collision avoidance.

``evaluate_policies`` measures every row of the results table with the same
code, ``examples.train_ppo.evaluate``: fresh episodes of the config, seeded
alike, the episode reward summed over the agents.

    python examples/scripted_spread.py --episodes 1000
    python examples/scripted_spread.py --episodes 1000 runs/spread-mappo-s1/checkpoints/final.ckpt

Prints and writes (``--out``) a JSON object: per policy the mean, the standard
deviation over episodes, the standard error and the episodes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `examples.train_ppo` importable
    sys.path.insert(0, str(REPO))

from examples.train_ppo import add_import_paths  # noqa: E402
from marl_runner import Callbacks, EnvRunner, RunnerConfig, restore_checkpoint  # noqa: E402
from marl_runner.policy.base import Policy, PolicyOutput  # noqa: E402

CONFIG = REPO / "examples" / "configs" / "simple_spread.yaml"
SCRIPTED = "examples.scripted_spread:GreedySpreadPolicy"
# MPE physics (mpe2 core): velocity is damped by 0.25 per step, a move adds 5.0 * dt = 0.5 to
# it along its axis, and the position moves by dt = 0.1 times the new velocity.
DAMPING, MOVE_DV, DT = 0.25, 0.5, 0.1
# Discrete moves 0-4: none, -x, +x, -y, +y.
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float64) * MOVE_DV


class GreedySpreadPolicy(Policy):
    """Each agent steers straight to its own landmark, from its observation alone.

    Expects simple_spread's observation with full observability and the discrete moves:
    ``[vel(2), pos(2), landmarks - pos (2N), other agents - pos (2(N-1)), comm (2(N-1))]``.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, config)
        dim = int(np.prod(observation_space.shape))
        if dim % 6 or not (isinstance(action_space, gym.spaces.Discrete) and action_space.n == 5):
            raise ValueError(
                "GreedySpreadPolicy needs simple_spread's observation (6N values for N agents) "
                f"and its 5 discrete moves, got {observation_space} and {action_space}"
            )
        self.num_agents = dim // 6
        # Every assignment of the N agents (self first) to the N landmarks.
        self.permutations = np.array(list(itertools.permutations(range(self.num_agents))))

    def compute_actions_from_input_dict(
        self,
        input_dict: Mapping[str, Any],
        explore: bool | None = None,
        timestep: int | None = None,
    ) -> PolicyOutput:
        """The move towards each row's own landmark."""
        obs = np.asarray(input_dict["obs"], np.float64).reshape(len(input_dict["obs"]), -1)
        n = self.num_agents
        vel = obs[:, 0:2]  # obs[:, 2:4], the absolute position, is not needed
        landmarks = obs[:, 4 : 4 + 2 * n].reshape(-1, n, 2)  # relative to this agent
        others = obs[:, 4 + 2 * n : 4 + 2 * n + 2 * (n - 1)].reshape(-1, n - 1, 2)
        agents = np.concatenate([np.zeros((len(obs), 1, 2)), others], 1)  # self first
        # dist[b, i, j]: agent i to landmark j; cost of each permutation (agent i -> perm[i]).
        dist = np.linalg.norm(agents[:, :, None, :] - landmarks[:, None, :, :], axis=-1)
        cost = dist[:, np.arange(n), self.permutations].sum(-1)  # [b, permutations]
        own = self.permutations[cost.argmin(1), 0]  # this agent's landmark
        target = landmarks[np.arange(len(obs)), own]  # relative to this agent
        # Where each move would leave the agent once it stops: next velocity v', then
        # dt * v' * (1 + 0.75 + 0.75^2 + ...) = dt * v' / damping.
        next_vel = (1 - DAMPING) * vel[:, None, :] + MOVES[None]  # [b, 5, 2]
        rest = next_vel * (DT + DT * (1 - DAMPING) / DAMPING)
        actions = np.linalg.norm(target[:, None, :] - rest, axis=-1).argmin(1)
        return actions.astype(self.action_space.dtype), [], {}


class EpisodeRewards(Callbacks):
    """The summed reward of the first ``quota`` episodes of each sub-env (not the first N to
    finish overall), so that every policy is scored on the same episodes."""

    def __init__(self, quota: list[int]) -> None:
        self.quota = quota
        self.per_env: list[list[float]] = [[] for _ in quota]

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        rewards = self.per_env[episode.env_id]
        if not episode.faulty and len(rewards) < self.quota[episode.env_id]:
            rewards.append(float(sum(episode.agent_rewards.values())))

    @property
    def done(self) -> bool:
        return all(len(r) >= q for r, q in zip(self.per_env, self.quota))


def with_policy_class(config: RunnerConfig, policy_class: str) -> RunnerConfig:
    """``config`` with every policy replaced by ``policy_class`` (no weights, no GAE)."""
    data = config.to_dict()
    data["policies"] = {pid: {"policy_class": policy_class} for pid in data["policies"]}
    return RunnerConfig.from_dict(data)


def episode_rewards(
    config: RunnerConfig,
    episodes: int,
    seed: int,
    weights: dict[str, Any] | None = None,
    explore: bool = True,
) -> np.ndarray:
    """Summed episode rewards of ``episodes`` fresh episodes of ``config`` (``weights`` set
    first), the same episodes for every policy given the same ``seed``; actions sampled as
    in training with ``explore``, else each policy's most likely action."""
    num_envs = min(episodes, config.num_envs)
    eval_config = config.with_overrides(
        ["batch_mode=complete_episodes", f"seed={seed}", f"num_envs={num_envs}",
         f"explore={str(explore).lower()}"]
    )  # fmt: skip
    quota = [episodes // num_envs + (e < episodes % num_envs) for e in range(num_envs)]
    results = EpisodeRewards(quota)
    with EnvRunner(eval_config, callbacks=results) as runner:
        if weights is not None:
            runner.set_weights(weights)
        while not results.done:
            runner.step()
    return np.array([r for rewards in results.per_env for r in rewards])


def summarise(rewards: np.ndarray) -> dict[str, float]:
    """Mean, standard deviation, standard error of the mean and count of ``rewards``."""
    return {
        "mean": round(float(rewards.mean()), 2),
        "std": round(float(rewards.std()), 2),
        "sem": round(float(rewards.std() / np.sqrt(len(rewards))), 2),
        "episodes": len(rewards),
    }


def evaluate_policies(
    config: RunnerConfig,
    episodes: int,
    seed: int,
    checkpoints: list[Path],
    baselines: bool = True,
) -> dict[str, dict[str, float]]:
    """Random and scripted (with ``baselines``) and each checkpoint's policy on the same
    ``episodes`` episodes; a checkpoint's twice, sampling its actions (as in training) and
    taking the likeliest."""
    results = {}
    if baselines:
        for name, policy_class in (("random", "RandomPolicy"), ("scripted", SCRIPTED)):
            rewards = episode_rewards(with_policy_class(config, policy_class), episodes, seed)
            results[name] = summarise(rewards)
    for path in checkpoints:
        with restore_checkpoint(path) as runner:
            weights = runner.get_weights()
        for explore, mode in ((True, "sampled"), (False, "greedy")):
            rewards = episode_rewards(config, episodes, seed, weights, explore)
            results[f"{path} ({mode})"] = summarise(rewards)
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", type=Path, help="runner checkpoints to score")
    parser.add_argument(
        "--config", type=Path, default=CONFIG, help="the env (its policies are replaced)"
    )
    parser.add_argument("--episodes", type=int, default=1000, help="episodes per policy")
    parser.add_argument("--seed", type=int, default=10_000, help="seeds the evaluation episodes")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--no-baselines", action="store_true", help="score the checkpoints only")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: expected an int >= 1")
    add_import_paths()
    results = evaluate_policies(
        RunnerConfig.from_yaml(args.config),
        args.episodes,
        args.seed,
        args.checkpoints,
        baselines=not args.no_baselines,
    )
    text = json.dumps(results, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
