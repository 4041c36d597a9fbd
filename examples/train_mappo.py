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


class CentralCriticLearner:
    """A policy's actor plus a critic on the global state: what ``ppo_update`` steps.

    ``evaluate`` returns the actor's log-probs and entropy of the stored actions
    and the critic's values; ``parameters`` covers both networks.
    """

    def __init__(self, actor: TorchPolicy, state_dim: int, num_agents: int) -> None:
        self.actor = actor
        self.device = actor.device
        self.num_agents = num_agents
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


def trajectory_bounds(batch: SampleBatch) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of one agent's consecutive steps (rows come grouped per
    trajectory and in time order, as the runner builds them)."""
    eps, agent, t = (np.asarray(batch[k]) for k in ("eps_id", "agent_index", "t"))
    cut = (eps[1:] != eps[:-1]) | (agent[1:] != agent[:-1]) | (t[1:] != t[:-1] + 1)
    starts = np.concatenate([[0], np.flatnonzero(cut) + 1])
    stops = np.append(starts[1:], len(t))
    return list(zip(starts.tolist(), stops.tolist()))


def central_gae(
    learner: CentralCriticLearner, batch: SampleBatch, args: argparse.Namespace
) -> None:
    """Adds ``vf_preds``, ``advantages`` and ``value_targets`` from the central critic.

    A trajectory that ends terminated is worth 0 after it; one cut by the fragment or
    truncated by a time limit is bootstrapped from the critic's value of ``new_env_state``.
    """
    with torch.no_grad():
        values = learner.values(batch).cpu().numpy()
        next_values = learner.values(batch, "new_env_state").cpu().numpy()
    advantages = np.zeros(len(values), np.float32)
    targets = np.zeros(len(values), np.float32)
    rewards, terminateds = np.asarray(batch["rewards"]), np.asarray(batch["terminateds"])
    for start, stop in trajectory_bounds(batch):
        last_value = 0.0 if terminateds[stop - 1] else float(next_values[stop - 1])
        advantages[start:stop], targets[start:stop] = compute_gae(
            rewards[start:stop], values[start:stop], last_value, args.gamma, args.gae_lambda
        )
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
        pid: CentralCriticLearner(actor, int(np.prod(state.shape[1:])), num_agents)
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
    return finish_args(build_parser(__doc__.split("\n\n")[0], MAPPO.run_tag), argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    require_matplotlib()
    add_import_paths()
    return run(args, make_mappo_config(args), MAPPO)


if __name__ == "__main__":
    main()
