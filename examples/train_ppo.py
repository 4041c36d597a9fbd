"""Independent PPO on marl-runner batches: one file, read it top to bottom.

Every policy of the config that is a TorchPolicy gets its own learner (a
copy of the policy), its own Adam optimiser and its own PPO update on the
rows of its agents; agents mapped to one policy share it (parameter
sharing). Each iteration:

1. ``runner.sample()``: one fragment per sub-env. The runner's GAE
   post-processing (policy config ``gae: {gamma, lambda}``, set below) has
   already added ``advantages`` and ``value_targets`` to every row.
2. PPO update per policy: clipped surrogate, value loss, entropy bonus,
   ``--update-epochs`` passes over shuffled minibatches, scoring the stored
   actions with ``TorchPolicy.evaluate``.
3. ``runner.set_weights``: the new weights go back into the sampler.

``train`` and ``run`` take the learners and the update as an ``Algorithm``
(``PPO`` here); ``examples/train_mappo.py`` passes its own and reuses the rest.

The learners train on ``--device`` (e.g. ``cuda``); the sampler's policies
stay on the config's ``device`` and get the weights as CPU arrays.

With ``--runners N`` the sampler is an ``EnvRunnerGroup``: N runners in Ray
actors, each stepping the config's ``num_envs`` sub-envs, sample in parallel
and ``group.sample()`` gathers one batch from each; the new weights go to
all of them with ``group.sync_weights`` (one object-store put) and
observation-filter statistics are merged with ``group.sync_connector_states``.
The group's local runner holds the weights between iterations and is what
checkpoints save. A local Ray is started for the run (and shut down at the
end) unless this process is already connected to one or ``--address`` names
a cluster.

Writes to ``--run-dir``: ``progress.csv`` (a row per iteration, also printed
with its env steps/s, SPS), ``learning_curve.png``, ``summary.json`` (random
vs trained mean episode reward) and ``checkpoints/``
(``marl_runner.save_checkpoint``). The plot needs matplotlib
(``pip install -e '.[plot]'``), checked at start-up; summary.json is written
before it is drawn.

    python examples/train_ppo.py --env simple_spread --total-env-steps 250000
    python examples/train_ppo.py --env kaz --runners 2 --total-env-steps 50000
    python examples/train_ppo.py --smoke   # a few seconds: checks the pipeline runs
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from marl_runner import (
    EnvRunner,
    MultiAgentBatch,
    RunnerConfig,
    SampleBatch,
    TorchPolicy,
    save_checkpoint,
)
from marl_runner.distributed import EnvRunnerGroup, ray_session
from marl_runner.metrics_log import plot_learning_curve
from marl_runner.policy.torch_utils import resolve_device
from marl_runner.tensorboard import summary_writer_class

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "examples" / "configs"
STAT_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "explained_var")
PPO_COLUMNS = ("action_logp", "advantages", "value_targets")  # what ppo_step needs as tensors


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each flag's default once: the value, unless the help already says what
    the default is (``default: the config's num_envs``) or there is none (None, off, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        no_value = action.default is None or action.default is False or action.default == []
        if "default" in help_text or no_value:
            return help_text
        return super()._get_help_string(action)


def build_parser(description: str, run_tag: str = "") -> argparse.ArgumentParser:
    """This example's flags; ``examples/train_mappo.py`` builds its parser here too, with its
    own description and ``run_tag`` (the default run dir is ``runs/<env><run_tag>-<time>``)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    # What to train on
    parser.add_argument(
        "--env",
        default="simple_spread",
        help=f"name of a runner config in {CONFIG_DIR.relative_to(REPO).as_posix()}/ "
        "(without .yaml)",
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="path of a runner config YAML; wins over --env"
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--fragment-length",
        type=int,
        default=None,
        help="steps per sub-env per iteration, counted as the config's count_steps_by "
        "(default: the config's rollout_fragment_length)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seeds the envs, the weights and the minibatch order"
    )
    parser.add_argument(
        "--runners",
        type=int,
        default=0,
        help="sample with this many runners in Ray actors (an EnvRunnerGroup), each with "
        "the config's num_envs sub-envs; 0: one runner in this process",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="with --runners: the Ray cluster to join (e.g. HEAD_IP:6379); default: the "
        "config's ray_address, else the running one, else a local Ray started for this run",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device the learners train on: cpu, cuda, cuda:N or auto (CUDA when "
        "available); sampling stays on the config's device, weights go back as CPU arrays",
    )
    add_run_arguments(parser, run_tag)
    add_ppo_arguments(parser)
    return parser


def add_run_arguments(parser: argparse.ArgumentParser, run_tag: str) -> None:
    """How long a run trains and evaluates, and what it writes where."""
    parser.add_argument(
        "--total-env-steps",
        type=int,
        default=250_000,
        help="stop once the runner has taken this many env steps",
    )
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=100,
        help="episodes to measure the mean episode reward of a random policy and of the trained one",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=20,
        help="save a runner checkpoint every this many iterations (and at the end)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where progress.csv, the plot and checkpoints go "
        f"(default: runs/<env>{run_tag}-<time>)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny step counts, to check the whole pipeline runs in a few seconds (CI)",
    )
    parser.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write each progress.csv row as TensorBoard scalars to <run-dir>/tensorboard "
        "(needs pip install 'marl-runner[tensorboard]')",
    )


def finish_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parses ``argv`` and checks it; ``--smoke`` shrinks every count so that a run takes
    seconds."""
    args = parser.parse_args(argv)
    if args.runners < 0:
        parser.error(f"--runners {args.runners}: expected an int >= 0")
    try:
        args.device = str(resolve_device(args.device))
    except ValueError as err:
        parser.error(f"--device {args.device}: {err}")
    check_ppo_arguments(parser, args)
    if args.smoke:
        args.num_envs, args.fragment_length = 2, args.fragment_length or 30
        args.eval_episodes, args.checkpoint_every = 2, 1
        args.total_env_steps = 60 * max(args.runners, 1)  # 3 iterations, runners or not
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return finish_args(build_parser(__doc__.split("\n\n")[0]), argv)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Two flags ``make_config`` reads besides the config itself: overrides and sub-envs.

    Shared with the self-play examples.
    """
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, as `marl-runner sample --set` (repeatable)",
    )
    parser.add_argument(
        "--num-envs",
        type=int,
        default=None,
        help="sub-envs sampled in parallel (default: the config's num_envs)",
    )


def add_ppo_arguments(parser: argparse.ArgumentParser) -> None:
    """The PPO hyper-parameter flags ``ppo_update`` reads (CleanRL's defaults, except the lr).

    Shared with the self-play examples, which change defaults with ``parser.set_defaults``.
    """
    parser.add_argument("--lr", type=float, default=7e-4, help="Adam learning rate")
    parser.add_argument(
        "--anneal-lr",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decay the learning rate linearly to 0 over --total-env-steps",
    )
    parser.add_argument("--gamma", type=float, default=0.99, help="discount, for the runner's GAE")
    parser.add_argument(
        "--gae-lambda", type=float, default=0.95, help="GAE lambda, for the runner's GAE"
    )
    parser.add_argument("--update-epochs", type=int, default=4, help="passes over each batch")
    parser.add_argument("--num-minibatches", type=int, default=4, help="minibatches per pass")
    parser.add_argument("--clip-coef", type=float, default=0.2, help="PPO ratio clipping")
    parser.add_argument(
        "--norm-adv",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="normalise advantages per minibatch",
    )
    parser.add_argument("--ent-coef", type=float, default=0.01, help="entropy bonus coefficient")
    parser.add_argument("--vf-coef", type=float, default=0.5, help="value loss coefficient")
    parser.add_argument(
        "--max-grad-norm", type=float, default=0.5, help="global gradient norm clip"
    )
    parser.add_argument(
        "--target-kl",
        type=float,
        default=None,
        help="stop a policy's update epochs early once its approx KL exceeds this (default: never)",
    )


def check_ppo_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects PPO flags that ``ppo_update`` cannot run with (``parser.error`` exits)."""
    for flag in ("update_epochs", "num_minibatches"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected an int >= 1")


def require_matplotlib() -> None:
    """Fails at start-up, not after the whole run, when the learning curve cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f"this example draws its learning curve with matplotlib ({err}): "
            "pip install -e '.[plot]'"
        ) from err


def make_config(args: argparse.Namespace) -> RunnerConfig:
    """The runner config, with GAE switched on for every TorchPolicy so batches carry advantages."""
    path = args.config or CONFIG_DIR / f"{args.env}.yaml"
    overrides = list(args.overrides) + [f"seed={args.seed}"]
    if args.num_envs is not None:
        overrides.append(f"num_envs={args.num_envs}")
    if args.fragment_length is not None:
        overrides.append(f"rollout_fragment_length={args.fragment_length}")
    data = RunnerConfig.from_yaml(path).with_overrides(overrides).to_dict()
    for spec in data["policies"].values():
        if spec.get("policy_class") in (None, "TorchPolicy"):
            policy_config = spec.setdefault("config", None) or {}
            policy_config["gae"] = {"gamma": args.gamma, "lambda": args.gae_lambda}
            spec["config"] = policy_config
    return RunnerConfig.from_dict(data)


def evaluate(config: RunnerConfig, episodes: int, **runner_kwargs: Any) -> dict[str, Any]:
    """``episode_reward_mean`` (all agents summed) and ``policy_reward_mean`` (per policy,
    its agents summed) over at least ``episodes`` whole fresh episodes.

    ``runner_kwargs`` go to ``EnvRunner`` (e.g. ``policies=``), except ``weights``,
    which are set on the runner's policies before sampling.
    """
    eval_config = config.with_overrides(
        ["batch_mode=complete_episodes", f"seed={config.seed + 10_000}"]
    )
    weights = runner_kwargs.pop("weights", None)
    with EnvRunner(eval_config, **runner_kwargs) as runner:
        if weights is not None:
            runner.set_weights(weights)
        runner.sample(num_episodes=episodes)
        metrics = runner.get_metrics()
    return {
        "episode_reward_mean": float(metrics["episode_reward_mean"]),
        "policy_reward_mean": dict(sorted(metrics["policy_reward_mean"].items())),
    }


def annealed_lr(args: argparse.Namespace, env_steps: int) -> float:
    """``--lr``, decayed linearly to 0 over ``--total-env-steps`` with ``--anneal-lr``."""
    if not args.anneal_lr:
        return args.lr
    return args.lr * (1 - env_steps / args.total_env_steps)


def ppo_update(
    learner: TorchPolicy,
    optimizer: torch.optim.Optimizer,
    batch: SampleBatch,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Clipped-objective PPO over one policy's rows; returns the last epoch's mean stats."""
    minibatch_size = max(1, len(batch) // args.num_minibatches)
    for _ in range(args.update_epochs):
        epoch_stats: dict[str, list[float]] = {key: [] for key in STAT_KEYS[:-1]}
        # Shuffled minibatches covering every row once (the last may be smaller).
        for minibatch in batch.minibatches(minibatch_size, seed=int(rng.integers(2**32))):
            for key, value in ppo_step(learner, optimizer, minibatch, args).items():
                epoch_stats[key].append(value)
        if args.target_kl is not None and np.mean(epoch_stats["approx_kl"]) > args.target_kl:
            break
    stats = {key: float(np.mean(values)) for key, values in epoch_stats.items()}
    # How much of the return variance the value function explained before this update.
    target_var = float(np.var(batch["value_targets"]))
    residual_var = float(np.var(batch["value_targets"] - batch["vf_preds"]))
    stats["explained_var"] = math.nan if target_var == 0 else 1 - residual_var / target_var
    return stats


def ppo_step(
    learner: TorchPolicy,
    optimizer: torch.optim.Optimizer,
    minibatch: SampleBatch,
    args: argparse.Namespace,
) -> dict[str, float]:
    """One gradient step on one minibatch, on the learner's device."""
    targets = SampleBatch({k: minibatch[k] for k in PPO_COLUMNS}).to_tensors(learner.device)
    logp, entropy, values = learner.evaluate(minibatch)  # with gradients
    log_ratio = logp - targets["action_logp"]
    ratio = log_ratio.exp()
    adv = targets["advantages"]
    if args.norm_adv and len(minibatch) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
    policy_loss = torch.max(-adv * ratio, -adv * clipped_ratio).mean()
    value_loss = 0.5 * (values - targets["value_targets"]).square().mean()
    entropy_mean = entropy.mean()
    loss = policy_loss - args.ent_coef * entropy_mean + args.vf_coef * value_loss

    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(learner.parameters()), args.max_grad_norm)
    optimizer.step()
    with torch.no_grad():  # http://joschu.net/blog/kl-approx.html
        return {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy_mean.item(),
            "approx_kl": float(((ratio - 1) - log_ratio).mean()),
            "clip_frac": float(((ratio - 1).abs() > args.clip_coef).float().mean()),
        }


def make_sampler(
    config: RunnerConfig, args: argparse.Namespace, stack: contextlib.ExitStack
) -> tuple[EnvRunner, EnvRunnerGroup | None]:
    """The runner whose weights training updates, and the group that samples for it
    (None: that runner samples itself); both are stopped when ``stack`` closes."""
    if not args.runners:
        return stack.enter_context(EnvRunner(config)), None
    try:
        import ray
    except ImportError as err:
        raise SystemExit(f"--runners needs Ray ({err}): pip install 'marl-runner[ray]'") from err
    # Joins --address (or the config's ray_address) or a running Ray, else starts a local
    # one; only a Ray started here is shut down at the end.
    stack.enter_context(ray_session(args.address or config.ray_address))
    cpus = ray.cluster_resources().get("CPU", 1.0)  # more runners than CPUs: they share
    group = EnvRunnerGroup(
        config, args.runners, local_runner=True, num_cpus_per_runner=min(1.0, cpus / args.runners)
    )
    stack.enter_context(group)
    print(f"sampling with {args.runners} runners in Ray actors", flush=True)
    return group.local_runner, group


def make_learners(
    runner: EnvRunner, args: argparse.Namespace
) -> tuple[dict[str, TorchPolicy], dict[str, torch.optim.Optimizer]]:
    """A learner copy of each of the runner's TorchPolicies, on ``--device``, and its optimiser.

    Training never touches the sampler's weights directly (which is how it works with
    remote runners too): ``get_weights`` hands them over as CPU arrays after each update.
    """
    spaces = runner.get_spaces()
    learners = {
        pid: TorchPolicy(*spaces[pid], {**policy.config, "device": args.device})
        for pid, policy in runner.policy_map.items()
        if isinstance(policy, TorchPolicy)
    }
    for pid, learner in learners.items():
        learner.set_weights(runner.policy_map[pid].get_weights())
    optimizers = {
        pid: torch.optim.Adam(learner.parameters(), lr=args.lr, eps=1e-5)
        for pid, learner in learners.items()
    }
    return learners, optimizers


class Algorithm(NamedTuple):
    """What ``train`` and ``run`` need to know of a PPO variant (``examples/train_mappo.py``
    passes its own).

    ``make_learners(runner, args, first_batch)`` builds the learners and their optimisers
    once the first batch is in (MAPPO's critic is as wide as the batch's ``env_state``); a
    learner has what ``ppo_step`` uses (``evaluate``, ``parameters``, ``device``) and
    ``get_weights``, what goes back to the sampler. ``update(learner, optimizer,
    policy_batch, args, rng)`` trains one learner on its policy's rows and returns its
    stats. ``name`` is summary.json's ``algorithm`` and titles the plot; ``run_tag`` goes
    into the default run dir, ``runs/<env><run_tag>-<time>``.
    """

    name: str
    make_learners: Callable[
        [EnvRunner, argparse.Namespace, MultiAgentBatch],
        tuple[dict[str, Any], dict[str, torch.optim.Optimizer]],
    ]
    update: Callable[
        [Any, torch.optim.Optimizer, SampleBatch, argparse.Namespace, np.random.Generator],
        dict[str, float],
    ]
    run_tag: str = ""


# Independent PPO: each TorchPolicy's learner copy, updated on its own rows by ppo_update.
PPO = Algorithm("ppo", lambda runner, args, _first_batch: make_learners(runner, args), ppo_update)


def random_baseline(config: RunnerConfig, episodes: int) -> dict[str, Any]:
    """``evaluate`` with the config's policies acting at random; each keeps its connector
    chains (frame stacks, resizes), so it sees what the trained one sees."""
    random_data = config.to_dict()
    for spec in random_data["policies"].values():
        spec["policy_class"] = "RandomPolicy"
    result = evaluate(RunnerConfig.from_dict(random_data), episodes)
    print(
        f"random policy: mean episode reward {result['episode_reward_mean']:.2f} ({episodes} "
        f"episodes), per policy {_rounded(result['policy_reward_mean'])}",
        flush=True,
    )
    return result


def progress_fields(policy_ids: list[str]) -> list[str]:
    """progress.csv's columns: counts, timings and episode metrics, then each policy's
    reward and update stats."""
    fieldnames = [
        "iteration", "env_steps", "agent_steps", "wall_s", "sps", "sample_s", "train_s",
        "episodes", "episode_reward_mean", "episode_len_mean", "lr",
    ]  # fmt: skip
    return fieldnames + [
        f"{pid}/{key}" for pid in policy_ids for key in ("reward_mean", *STAT_KEYS)
    ]


class ProgressLog:
    """progress.csv, one row per iteration, each also printed as a line with its steps/s and
    with ``tensorboard`` written as TensorBoard scalars; the files close with ``stack``.

    Shared with the Connect Four examples, which log their own ``fieldnames``.
    """

    def __init__(
        self,
        run_dir: Path,
        fieldnames: list[str],
        stack: contextlib.ExitStack,
        tensorboard: bool = False,
    ) -> None:
        self.file = stack.enter_context(
            (run_dir / "progress.csv").open("w", newline="", encoding="utf-8")
        )
        self.csv = csv.DictWriter(self.file, fieldnames=fieldnames)
        self.csv.writeheader()
        self.tensorboard = None
        if tensorboard:
            self.tensorboard = summary_writer_class()(str(run_dir / "tensorboard"))
            stack.callback(self.tensorboard.close)
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any], detail: str) -> None:
        """Writes ``row`` (it needs iteration, env_steps and sps) and prints it with ``detail``."""
        self.csv.writerow(row)
        self.file.flush()
        if self.tensorboard is not None:
            for key, value in row.items():
                if key != "iteration" and math.isfinite(value):
                    self.tensorboard.add_scalar(key, value, global_step=row["env_steps"])
            self.tensorboard.flush()
        self.rows.append(row)
        print(
            f"iter {row['iteration']:4d}  env_steps {row['env_steps']:8d}  SPS {row['sps']:7.0f}  "
            + detail,
            flush=True,
        )


def update_learners(
    algorithm: Algorithm,
    learners: dict[str, Any],
    optimizers: dict[str, torch.optim.Optimizer],
    batch: MultiAgentBatch,
    lr: float,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> dict[str, float]:
    """``algorithm.update`` of every learner whose policy has rows in ``batch``, at learning
    rate ``lr``; returns their stats as ``<policy>/<stat>``."""
    stats = {}
    for pid, learner in learners.items():
        optimizers[pid].param_groups[0]["lr"] = lr
        if pid in batch.policy_batches:
            policy_batch = batch.policy_batches[pid]
            policy_stats = algorithm.update(learner, optimizers[pid], policy_batch, args, rng)
            stats.update({f"{pid}/{key}": value for key, value in policy_stats.items()})
    return stats


def send_weights(runner: EnvRunner, group: EnvRunnerGroup | None, learners: dict[str, Any]) -> None:
    """The learners' weights, as CPU arrays, into the sampler."""
    weights = {pid: learner.get_weights() for pid, learner in learners.items()}
    if group is None:
        runner.set_weights(weights)
    else:
        group.sync_weights(weights)  # the local runner and, with one put, every remote one
        group.sync_connector_states()  # observation filters: merged statistics everywhere


def train(
    runner: EnvRunner,
    group: EnvRunnerGroup | None,
    args: argparse.Namespace,
    log: ProgressLog,
    run_dir: Path,
    algorithm: Algorithm = PPO,
) -> dict[str, Any]:
    """Sample, update every learner, hand the weights back; until --total-env-steps."""
    sampler = runner if group is None else group
    rng = np.random.default_rng(args.seed)
    learners: dict[str, Any] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    env_steps = agent_steps = iteration = 0
    sample_total = train_total = 0.0
    start = time.perf_counter()
    while env_steps < args.total_env_steps:
        iteration += 1
        lr = annealed_lr(args, env_steps)
        sample_start = time.perf_counter()
        batch = sampler.sample()
        metrics = sampler.get_metrics()
        env_steps += batch.env_steps()
        agent_steps += batch.agent_steps()

        train_start = time.perf_counter()
        if iteration == 1:
            learners, optimizers = algorithm.make_learners(runner, args, batch)
        stats = update_learners(algorithm, learners, optimizers, batch, lr, args, rng)
        send_weights(runner, group, learners)
        now = time.perf_counter()
        sample_total += train_start - sample_start
        train_total += now - train_start

        row = {
            "iteration": iteration,
            "env_steps": env_steps,
            "agent_steps": agent_steps,
            "wall_s": round(now - start, 3),
            "sps": round(env_steps / (now - start), 1),  # env steps/s, sampling + training
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
        log.write(row, f"episode_reward_mean {row['episode_reward_mean']:8.2f}")
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
        # Where the time went: env steps/s of sampling alone and of learning alone.
        "sample_s": round(sample_total, 1),
        "learn_s": round(train_total, 1),
        "sample_sps": round(env_steps / sample_total, 1),
        "learn_sps": round(env_steps / train_total, 1),
    }


def add_import_paths() -> None:
    """Configs name classes and functions by import path: ``examples.mappings:...`` resolves
    from the repository root, a user's own package from the current folder."""
    for path in (str(REPO), os.getcwd()):
        if path not in sys.path:
            sys.path.insert(0, path)


def make_run_dir(run_dir: Path | None, name: str) -> Path:
    """``run_dir``, or ``runs/<name>-<time>`` when None; created, and printed. Shared with
    the Connect Four examples."""
    run_dir = run_dir or Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run dir: {run_dir}", flush=True)
    return run_dir


def run(
    args: argparse.Namespace, config: RunnerConfig, algorithm: Algorithm = PPO
) -> dict[str, Any]:
    """The whole run on ``config``: random baseline, training, the trained weights
    evaluated, summary.json, then the plot; returns the summary."""
    env_name = args.config.stem if args.config else args.env
    run_dir = make_run_dir(args.run_dir, env_name + algorithm.run_tag)

    with contextlib.ExitStack() as stack:
        runner, group = make_sampler(config, args, stack)
        random_eval = random_baseline(config, args.eval_episodes)
        policy_ids = [pid for pid, p in runner.policy_map.items() if isinstance(p, TorchPolicy)]
        log = ProgressLog(run_dir, progress_fields(policy_ids), stack, args.tensorboard)
        counts = train(runner, group, args, log, run_dir, algorithm)
        weights = runner.get_weights()

    trained_eval = evaluate(config, args.eval_episodes, weights=weights)
    print(
        f"trained policy: mean episode reward {trained_eval['episode_reward_mean']:.2f} "
        f"({args.eval_episodes} episodes), per policy "
        f"{_rounded(trained_eval['policy_reward_mean'])}"
    )
    summary = {
        "env": env_name,
        "algorithm": algorithm.name,
        **counts,
        "eval_episodes": args.eval_episodes,
        "random_episode_reward_mean": random_eval["episode_reward_mean"],
        "trained_episode_reward_mean": trained_eval["episode_reward_mean"],
        "random_policy_reward_mean": random_eval["policy_reward_mean"],
        "trained_policy_reward_mean": trained_eval["policy_reward_mean"],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    draw_curve(log.rows, run_dir, f"{algorithm.name.upper()} on {env_name}", summary)
    print(json.dumps(summary, indent=2))
    return summary


def draw_curve(
    rows: list[dict[str, Any]], run_dir: Path, what: str, summary: dict[str, Any]
) -> None:
    """learning_curve.png with the random and the trained policy's evaluations as lines;
    ``what`` (e.g. ``PPO on simple_spread``) starts the title."""
    if not any(math.isfinite(row["episode_reward_mean"]) for row in rows):
        print("no episode finished during training: no learning curve to draw")
        return
    plot_learning_curve(
        rows,
        run_dir / "learning_curve.png",
        baselines={
            "random policy": summary["random_episode_reward_mean"],
            "trained, evaluated": summary["trained_episode_reward_mean"],
        },
        title=f"{what}: mean episode reward (all agents summed)",
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    require_matplotlib()
    add_import_paths()
    return run(args, make_config(args))


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 2) for key, value in values.items()}


if __name__ == "__main__":
    main()
