"""MAPPO on marl-runner batches: a shared actor on each agent's own obs, a centralised critic
on the env's global state.

Same loop, flags and files as ``examples/train_ppo.py`` (``--help`` lists them): its
``run`` and ``train`` get ``MAPPO`` below, this file's learners and update. What differs:

1. The config gets ``env.capture_state: true``: every row carries ``env_state``
   (PettingZoo's ``state()`` when the row's obs was seen) and ``new_env_state``
   (with its ``new_obs``), computed where the env runs. The actor never sees it.
2. Each TorchPolicy's learner is a ``CentralCriticLearner``: the policy's actor
   (a learner copy, as in IPPO) plus a critic MLP on ``env_state`` and the
   agent's one-hot index (agent-specific global state: agents sharing the
   actor may earn different rewards). The policy's own value head is unused.
3. Advantages are GAE over the critic's values (``central_gae``), bootstrapped
   from ``new_env_state`` where a trajectory is cut or truncated; then
   ``train_ppo.ppo_update`` runs unchanged on the learner.

Only the actor's weights go back to the sampler; the critic lives in the learner.

    python examples/train_mappo.py --env simple_spread --total-env-steps 300000
    python examples/train_mappo.py --smoke   # a few seconds: checks the pipeline runs
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `examples.train_ppo` importable
    sys.path.insert(0, str(REPO))

from examples.train_ppo import (  # noqa: E402
    Algorithm,
    add_import_paths,
    build_parser,
    finish_args,
    make_config,
    make_learners,
    ppo_update,
    require_matplotlib,
    run,
)
from marl_runner import (  # noqa: E402
    EnvRunner,
    MultiAgentBatch,
    RunnerConfig,
    SampleBatch,
    TorchPolicy,
)
from marl_runner.policy.gae import compute_gae  # noqa: E402

CRITIC_HIDDEN = (64, 64)


class ValueNorm:
    """Running mean and std of the value targets: the critic learns them standardised.

    Returns on simple_spread are tens of units; unscaled, the value loss dwarfs the policy
    loss in the one clipped gradient. The critic outputs standardised values, GAE runs on
    them mapped back (``denormalize``), and the targets it regresses on are standardised
    with the statistics updated by each batch (the MAPPO paper's ValueNorm). Statistics
    are exponential moving averages with a bias correction, so early batches count fully.
    """

    def __init__(self, beta: float = 0.99, epsilon: float = 1e-5) -> None:
        self.beta, self.epsilon = beta, epsilon
        self.mean = self.mean_sq = self.debias = 0.0

    def update(self, targets: np.ndarray) -> None:
        """Folds one batch of targets into the running statistics."""
        targets = np.asarray(targets, np.float64)
        self.mean = self.beta * self.mean + (1 - self.beta) * float(targets.mean())
        self.mean_sq = self.beta * self.mean_sq + (1 - self.beta) * float(np.square(targets).mean())
        self.debias = self.beta * self.debias + (1 - self.beta)

    def stats(self) -> tuple[float, float]:
        """(mean, std); (0, 1) before the first update."""
        if self.debias == 0:
            return 0.0, 1.0
        mean = self.mean / self.debias
        var = max(self.mean_sq / self.debias - mean**2, 0.0)
        return mean, math.sqrt(var) + self.epsilon

    def normalize(self, values: np.ndarray) -> np.ndarray:
        mean, std = self.stats()
        return ((np.asarray(values) - mean) / std).astype(np.float32)

    def denormalize(self, values: np.ndarray) -> np.ndarray:
        mean, std = self.stats()
        return (np.asarray(values) * std + mean).astype(np.float32)


class CentralCriticLearner:
    """A policy's actor plus a critic on the global state: what ``ppo_update`` steps.

    ``evaluate`` returns the actor's log-probs and entropy of the stored actions
    and the critic's values; ``parameters`` covers both networks.
    """

    def __init__(
        self,
        actor: TorchPolicy,
        state_dim: int,
        num_agents: int,
        value_norm: ValueNorm | None = None,
    ) -> None:
        self.actor = actor
        self.device = actor.device
        self.num_agents = num_agents
        self.value_norm = value_norm  # None: the critic learns the returns as they are
        layers: list[nn.Module] = []
        width = state_dim + num_agents
        for hidden in CRITIC_HIDDEN:
            layers += [nn.Linear(width, hidden), nn.Tanh()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.critic = nn.Sequential(*layers).to(self.device)

    def parameters(self) -> Iterator[nn.Parameter]:
        return itertools.chain(self.actor.parameters(), self.critic.parameters())

    def values(self, batch: SampleBatch, state_column: str = "env_state") -> torch.Tensor:
        """``[n]`` critic values of ``state_column`` (``env_state`` or ``new_env_state``)."""
        states = torch.as_tensor(np.asarray(batch[state_column], np.float32), device=self.device)
        index = np.asarray(batch["agent_index"], np.int64)
        if index.size and int(index.max()) >= self.num_agents:
            raise ValueError(
                f"agent_index {int(index.max())} in the batch, but the critic was built for "
                f"{self.num_agents} agents (the env's possible_agents)"
            )
        one_hot = torch.nn.functional.one_hot(
            torch.as_tensor(index, device=self.device), self.num_agents
        ).float()
        return self.critic(torch.cat([states.reshape(len(states), -1), one_hot], 1)).reshape(-1)

    def evaluate(self, batch: SampleBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logp, entropy, _ = self.actor.evaluate(batch)
        return logp, entropy, self.values(batch)

    def get_weights(self) -> dict[str, np.ndarray]:
        """The actor's weights: all the sampler runs."""
        return self.actor.get_weights()


def make_mappo_config(args: argparse.Namespace) -> RunnerConfig:
    """``train_ppo.make_config`` with the state captured and the runner's own GAE off (its
    values would come from the actor's value head; ``central_gae`` replaces them)."""
    data = make_config(args).to_dict()
    data["env"]["capture_state"] = True
    for spec in data["policies"].values():
        (spec.get("config") or {}).pop("gae", None)
    return RunnerConfig.from_dict(data)


def trajectory_rows(batch: SampleBatch) -> list[np.ndarray]:
    """The row indices of each run of one agent's consecutive steps, in time order.

    Makes no assumption on the batch's row order (the runner stores rows of many
    trajectories interleaved, step by step): rows are sorted by episode, agent and
    ``t``, and cut wherever one of them changes or ``t`` skips.
    """
    eps, agent, t = (np.asarray(batch[k]) for k in ("eps_id", "agent_index", "t"))
    order = np.lexsort((t, agent, eps))
    eps, agent, t = eps[order], agent[order], t[order]
    cut = (eps[1:] != eps[:-1]) | (agent[1:] != agent[:-1]) | (t[1:] != t[:-1] + 1)
    return np.split(order, np.flatnonzero(cut) + 1) if len(order) else []


def central_gae(
    learner: CentralCriticLearner, batch: SampleBatch, args: argparse.Namespace
) -> None:
    """Adds ``vf_preds``, ``advantages`` and ``value_targets`` from the central critic.

    A trajectory that ends terminated is worth 0 after it; one cut by the fragment or
    truncated by a time limit is bootstrapped from the critic's value of ``new_env_state``.
    With the learner's ``value_norm``, GAE runs on the critic's values mapped back to
    returns, and ``vf_preds`` and ``value_targets`` are stored standardised (what the
    critic regresses on), after the batch's targets updated the statistics.
    """
    with torch.no_grad():
        values = learner.values(batch).cpu().numpy()
        next_values = learner.values(batch, "new_env_state").cpu().numpy()
    norm = learner.value_norm
    if norm is not None:
        values, next_values = norm.denormalize(values), norm.denormalize(next_values)
    advantages = np.zeros(len(values), np.float32)
    targets = np.zeros(len(values), np.float32)
    rewards, terminateds = np.asarray(batch["rewards"]), np.asarray(batch["terminateds"])
    for rows in trajectory_rows(batch):
        last = rows[-1]
        last_value = 0.0 if terminateds[last] else float(next_values[last])
        advantages[rows], targets[rows] = compute_gae(
            rewards[rows], values[rows], last_value, args.gamma, args.gae_lambda
        )
    if norm is not None:
        norm.update(targets)
        values, targets = norm.normalize(values), norm.normalize(targets)
    batch["vf_preds"], batch["advantages"], batch["value_targets"] = values, advantages, targets


def make_central_learners(
    runner: EnvRunner, args: argparse.Namespace, first_batch: MultiAgentBatch
) -> tuple[dict[str, CentralCriticLearner], dict[str, torch.optim.Optimizer]]:
    """``train_ppo.make_learners``' actor copies, each with a critic as wide as the first
    batch's ``env_state``, and one Adam for both."""
    state = next(iter(first_batch.policy_batches.values()))["env_state"]
    actors, _ = make_learners(runner, args)
    num_agents = len(runner.env.possible_agents)
    torch.manual_seed(args.seed)
    learners = {
        pid: CentralCriticLearner(
            actor,
            int(np.prod(state.shape[1:])),
            num_agents,
            ValueNorm() if args.value_norm else None,
        )
        for pid, actor in actors.items()
    }
    optimizers = {
        pid: torch.optim.Adam(learner.parameters(), lr=args.lr, eps=1e-5)
        for pid, learner in learners.items()
    }
    return learners, optimizers


def mappo_update(
    learner: CentralCriticLearner,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> dict[str, float]:
    """The central critic's advantages, then ``train_ppo.ppo_update`` unchanged."""
    central_gae(learner, batch, args)
    return ppo_update(learner, optimizer, batch, args, rng)


# train_ppo's loop, run and files with these learners and this update.
MAPPO = Algorithm("mappo", make_central_learners, mappo_update, run_tag="-mappo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser(__doc__.split("\n\n")[0], MAPPO.run_tag)
    parser.add_argument(
        "--value-norm",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the critic learns standardised returns (running mean and std of the targets)",
    )
    return finish_args(parser, argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    require_matplotlib()
    add_import_paths()
    return run(args, make_mappo_config(args), MAPPO)


if __name__ == "__main__":
    main()
