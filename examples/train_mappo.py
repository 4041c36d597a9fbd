"""MAPPO on marl-runner batches: a shared actor on each agent's own obs, a centralised critic
on the env's global state. The IPPO pieces come from ``examples/train_ppo.py``.

Same loop, flags and files as ``train_ppo.py`` (``--help`` lists them); what differs:

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
import contextlib
import itertools
import json
import math
import sys
import time
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
    ProgressLog,
    draw_curve,
    evaluate,
    make_config,
    make_learners,
    make_sampler,
    parse_args,
    ppo_update,
    random_baseline,
    require_matplotlib,
)
from marl_runner import (  # noqa: E402
    EnvRunner,
    RunnerConfig,
    SampleBatch,
    TorchPolicy,
    save_checkpoint,
)
from marl_runner.distributed import EnvRunnerGroup  # noqa: E402
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


def central_gae(learner: CentralCriticLearner, batch: SampleBatch, args: argparse.Namespace) -> None:
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
    runner: EnvRunner, args: argparse.Namespace, state_dim: int
) -> tuple[dict[str, CentralCriticLearner], dict[str, torch.optim.Optimizer]]:
    """``train_ppo.make_learners``' actor copies, each with a critic, and one Adam for both."""
    actors, _ = make_learners(runner, args)
    num_agents = len(runner.env.possible_agents)
    torch.manual_seed(args.seed)
    learners = {
        pid: CentralCriticLearner(actor, state_dim, num_agents) for pid, actor in actors.items()
    }
    optimizers = {
        pid: torch.optim.Adam(learner.parameters(), lr=args.lr, eps=1e-5)
        for pid, learner in learners.items()
    }
    return learners, optimizers


def train(
    runner: EnvRunner,
    group: EnvRunnerGroup | None,
    args: argparse.Namespace,
    log: ProgressLog,
    run_dir: Path,
) -> dict[str, Any]:
    """``train_ppo.train``'s loop with central-critic learners, built on the first batch
    (the critic's input width is the env state's)."""
    sampler = runner if group is None else group
    rng = np.random.default_rng(args.seed)
    learners: dict[str, CentralCriticLearner] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    env_steps = agent_steps = iteration = 0
    start = time.perf_counter()
    while env_steps < args.total_env_steps:
        iteration += 1
        lr = args.lr * (1 - env_steps / args.total_env_steps) if args.anneal_lr else args.lr
        sample_start = time.perf_counter()
        batch = sampler.sample()
        metrics = sampler.get_metrics()
        env_steps += batch.env_steps()
        agent_steps += batch.agent_steps()

        train_start = time.perf_counter()
        if not learners:
            state = next(iter(batch.policy_batches.values()))["env_state"]
            learners, optimizers = make_central_learners(runner, args, int(np.prod(state.shape[1:])))
        stats = {}
        for pid, learner in learners.items():
            optimizers[pid].param_groups[0]["lr"] = lr
            if pid in batch.policy_batches:
                policy_batch = batch.policy_batches[pid]
                central_gae(learner, policy_batch, args)
                policy_stats = ppo_update(learner, optimizers[pid], policy_batch, args, rng)
                stats.update({f"{pid}/{key}": value for key, value in policy_stats.items()})
        weights = {pid: learner.get_weights() for pid, learner in learners.items()}
        if group is None:
            runner.set_weights(weights)
        else:
            group.sync_weights(weights)
            group.sync_connector_states()
        now = time.perf_counter()

        log.write(
            {
                "iteration": iteration,
                "env_steps": env_steps,
                "agent_steps": agent_steps,
                "wall_s": round(now - start, 3),
                "sps": round(env_steps / (now - start), 1),
                "sample_s": round(train_start - sample_start, 3),
                "train_s": round(now - train_start, 3),
                "episodes": metrics["episodes"],
                "episode_reward_mean": metrics["episode_reward_mean"],
                "episode_len_mean": metrics["episode_len_mean"],
                "lr": lr,
                **{
                    f"{pid}/reward_mean": metrics["policy_reward_mean"].get(pid, math.nan)
                    for pid in learners
                },
                **stats,
            }
        )
        if iteration % args.checkpoint_every == 0:
            save_checkpoint(runner, run_dir / "checkpoints" / f"iter_{iteration:05d}.ckpt")
    save_checkpoint(runner, run_dir / "checkpoints" / "final.ckpt")
    wall_s = time.perf_counter() - start
    return {
        "env_steps": env_steps,
        "agent_steps": agent_steps,
        "iterations": iteration,
        "train_wall_s": round(wall_s, 1),
        "sps": round(env_steps / wall_s, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    require_matplotlib()
    config = make_mappo_config(args)
    env_name = args.config.stem if args.config else args.env
    run_dir = args.run_dir or Path("runs") / f"{env_name}-mappo-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run dir: {run_dir}", flush=True)

    with contextlib.ExitStack() as stack:
        runner, group = make_sampler(config, args, stack)
        random_eval = random_baseline(config, args.eval_episodes)
        policy_ids = [pid for pid, p in runner.policy_map.items() if isinstance(p, TorchPolicy)]
        log = ProgressLog(run_dir, policy_ids, args.tensorboard, stack)
        counts = train(runner, group, args, log, run_dir)
        weights = runner.get_weights()

    trained_eval = evaluate(config, args.eval_episodes, weights=weights)
    print(f"trained policy: mean episode reward {trained_eval['episode_reward_mean']:.2f}")
    summary = {
        "env": env_name,
        "algorithm": "mappo",
        **counts,
        "eval_episodes": args.eval_episodes,
        "random_episode_reward_mean": random_eval["episode_reward_mean"],
        "trained_episode_reward_mean": trained_eval["episode_reward_mean"],
        "random_policy_reward_mean": random_eval["policy_reward_mean"],
        "trained_policy_reward_mean": trained_eval["policy_reward_mean"],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    draw_curve(log.rows, run_dir, f"{env_name} (MAPPO)", summary)
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
