"""Connect Four league self-play: a learner against a pool of its own frozen past selves.

Plain self-play (``examples/selfplay_connect_four.py``) always plays the
newest policy against itself, which can chase its own tail; a league keeps
old versions around as opponents. Read it top to bottom:

- the runner starts with ONE policy, ``learner``, the only one trained;
- every ``--snapshot-every`` iterations a frozen copy of the learner joins
  the pool: ``runner.add_policy("snap_0003", spec)`` then
  ``runner.set_weights({"snap_0003": learner weights})``. A snapshot's spec
  has no GAE config, so its rows get no post-processing; they are in the
  batch but never trained on;
- the pool holds at most ``--pool-size`` snapshots: the oldest is removed
  with ``runner.remove_policy``. Games it was playing go on with the newest
  snapshot in its seat (the runner asks the mapping again for those agents);
- ``LeagueMatchmaker``, set as the runner's mapping function, draws for each
  game a seat for the learner and an opponent from the pool;
- with ``--bot-share``, that share of the games is against the 1-ply bot of
  ``examples/connect_four_bots.py`` (policy ``bot``, never removed) instead of
  a snapshot; the learner's win rate in them is logged apart (``bot_win``);
- each iteration logs the learner's win/draw/loss rates against the pool
  (``progress.csv``, ``win_rate_vs_pool.png``); the final matches against
  ``RandomPolicy`` and the 1-ply bot are those of the self-play example.

    python examples/league_connect_four.py --total-env-steps 200000
    python examples/league_connect_four.py --bot-share 0.5 --eval-bot-games-during 100
    python examples/league_connect_four.py --smoke   # a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(REPO))

from examples.selfplay_connect_four import (  # noqa: E402
    SEATS,
    WinRatePlot,
    bot_opponent,
    build_parser,
    finish_args,
    finish_run,
    make_learner,
    vs_bot_during_training,
    vs_random_during_training,
)
from examples.train_ppo import (  # noqa: E402
    STAT_KEYS,
    ProgressLog,
    annealed_lr,
    make_config,
    make_run_dir,
    ppo_update,
    require_matplotlib,
)
from marl_runner import Callbacks, EnvRunner, RunnerConfig, TorchPolicy, save_checkpoint  # noqa: E402

LEARNER = "learner"
BOT = "bot"  # the 1-ply bot's policy id, with --bot-share
PROGRESS_FIELDS = (  # progress.csv's columns, a row per iteration
    "iteration", "env_steps", "wall_s", "sps", "sample_s", "train_s", "learner_rows", "lr",
    "pool_win", "pool_draw", "pool_loss", "pool_games", "pool_size", "pool_oldest", "pool_newest",
    "bot_win", "bot_games", "vs_random_win", "vs_bot_win", *STAT_KEYS,
)  # fmt: skip
IterationHook = Callable[[int, EnvRunner, list[str], TorchPolicy], None]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser(__doc__.split("\n\n")[0], run_name="league")
    parser.set_defaults(total_env_steps=200_000)
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=5,
        help="add a frozen copy of the learner to the pool every this many iterations",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=4,
        help="most snapshots kept in the pool; adding one more removes the oldest",
    )
    parser.add_argument(
        "--bot-share",
        type=float,
        default=0.0,
        help="share of the games in which the learner meets the 1-ply bot of "
        "examples/connect_four_bots.py instead of a snapshot",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="also save a runner checkpoint every this many iterations (0: only final.ckpt)",
    )
    args = finish_args(parser, argv)
    if not 0.0 <= args.bot_share <= 1.0:
        parser.error(f"--bot-share {args.bot_share}: expected a share in [0, 1]")
    if args.checkpoint_every < 0:
        parser.error(f"--checkpoint-every {args.checkpoint_every}: expected an int >= 0")
    if args.smoke:
        args.snapshot_every, args.pool_size = 1, 2
    if args.snapshot_every < 1 or args.pool_size < 1:
        parser.error(
            f"--snapshot-every and --pool-size must be at least 1, got "
            f"{args.snapshot_every} and {args.pool_size}"
        )
    return args


class LeagueMatchmaker:
    """The mapping function: per game, a random seat for the learner and an opponent from the pool.

    The draw is kept in ``episode.user_data`` so that both seats of one game
    agree. With an empty pool the learner plays itself. When the runner asks
    again for a game whose opponent was removed from the pool, the newest
    snapshot takes over that seat: every such game gets the same one, as the
    runner requires of a removal (see ``EnvRunner.remove_policy``). With ``bot_share``,
    that share of the games is against the policy ``bot`` instead (never removed).
    """

    def __init__(self, seed: int, bot_share: float = 0.0) -> None:
        self.pool: list[str] = []
        self.bot_share = bot_share
        self._rng = np.random.default_rng(seed)

    def __call__(self, agent_id: str, episode: Any, **kwargs: Any) -> str:
        matchup = episode.user_data.get("league")
        if matchup is None:
            seat = SEATS[int(self._rng.integers(len(SEATS)))]
            opponent = self.pool[int(self._rng.integers(len(self.pool)))] if self.pool else LEARNER
            if self.bot_share and self._rng.random() < self.bot_share:
                opponent = BOT
            matchup = episode.user_data["league"] = {"learner_seat": seat, "opponent": opponent}
        elif matchup["opponent"] not in (LEARNER, BOT, *self.pool):
            matchup["opponent"] = self.pool[-1]
        return LEARNER if agent_id == matchup["learner_seat"] else matchup["opponent"]

    def pool_columns(self) -> dict[str, int]:
        """The pool's size and its oldest and newest snapshot numbers (snap_0007 -> 7), so
        that progress.csv stays all numbers."""
        return {
            "pool_size": len(self.pool),
            "pool_oldest": int(self.pool[0].split("_")[1]),
            "pool_newest": int(self.pool[-1].split("_")[1]),
        }


class LeagueResults(Callbacks):
    """The learner's result (+1, 0, -1) in each finished game against a snapshot, and apart
    in each game against the bot."""

    def __init__(self) -> None:
        self.results: list[float] = []
        self.bot_results: list[float] = []

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        matchup = episode.user_data.get("league")
        if episode.faulty or matchup is None or matchup["opponent"] == LEARNER:
            return
        (learner_reward,) = (
            reward for (_, pid), reward in episode.agent_rewards.items() if pid == LEARNER
        )
        (self.bot_results if matchup["opponent"] == BOT else self.results).append(learner_reward)

    def pop_rates(self) -> dict[str, float]:
        """Win/draw/loss rates against the pool and the win rate against the bot, with the
        games of each since the last call (NaN rates without games)."""
        bot_outcomes, self.bot_results = np.sign(self.bot_results), []
        bot = {
            "bot_win": float(np.mean(bot_outcomes > 0)) if len(bot_outcomes) else math.nan,
            "bot_games": len(bot_outcomes),
        }
        return {**self._pool_rates(), **bot}

    def _pool_rates(self) -> dict[str, float]:
        outcomes, self.results = np.sign(self.results), []
        if not len(outcomes):
            return {
                "pool_win": math.nan,
                "pool_draw": math.nan,
                "pool_loss": math.nan,
                "pool_games": 0,
            }
        return {
            "pool_win": float(np.mean(outcomes > 0)),
            "pool_draw": float(np.mean(outcomes == 0)),
            "pool_loss": float(np.mean(outcomes < 0)),
            "pool_games": len(outcomes),
        }


def league_config(args: argparse.Namespace) -> RunnerConfig:
    """The config's one policy, renamed ``learner``; GAE on (``make_config``); with
    ``--bot-share``, the 1-ply bot as policy ``bot``."""
    data = make_config(args).to_dict()
    if len(data["policies"]) != 1:
        raise ValueError(f"{args.config}: expected one policy, got {sorted(data['policies'])}")
    (spec,) = data["policies"].values()
    policies = {LEARNER: spec}
    if args.bot_share:
        policies[BOT] = bot_opponent(args.seed)
    data.update(policies=policies, policy_mapping_fn=None)
    return RunnerConfig.from_dict(data)


def learner_only(config: RunnerConfig) -> RunnerConfig:
    """``config`` without the bot: the learner's policy alone."""
    data = config.to_dict()
    data["policies"] = {LEARNER: data["policies"][LEARNER]}
    return RunnerConfig.from_dict(data)


def add_snapshot(
    runner: EnvRunner, matchmaker: LeagueMatchmaker, learner: TorchPolicy, name: str, pool_size: int
) -> None:
    """Freezes the learner's weights as policy ``name``; evicts the oldest beyond ``pool_size``."""
    learner_spec = runner.config.policies[LEARNER]
    no_gae = {k: v for k, v in (learner_spec.get("config") or {}).items() if k != "gae"}
    # Spaces in the spec: the snapshot is built now, before any agent maps to it, so that
    # its weights can be set before it plays.
    runner.add_policy(
        name,
        {
            **learner_spec,
            "config": no_gae,
            "observation_space": runner.env.get_observation_space(SEATS[0]),
            "action_space": runner.env.get_action_space(SEATS[0]),
        },
    )
    runner.set_weights({name: learner.get_weights()})
    matchmaker.pool.append(name)
    while len(matchmaker.pool) > pool_size:
        runner.remove_policy(matchmaker.pool.pop(0))


def main(
    argv: list[str] | None = None, on_iteration: IterationHook | None = None
) -> dict[str, Any]:
    """Trains; ``on_iteration(iteration, runner, pool, learner)`` runs after each iteration."""
    args = parse_args(argv)
    require_matplotlib()
    config = league_config(args)
    # The matches against RandomPolicy and the bot build their own runner from the learner alone.
    match_config = learner_only(config)
    run_dir = make_run_dir(args.run_dir, "league")
    rng = np.random.default_rng(args.seed)

    matchmaker = LeagueMatchmaker(args.seed, args.bot_share)
    results = LeagueResults()
    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(
            EnvRunner(config, policy_mapping_fn=matchmaker, callbacks=results)
        )
        learner, optimizer = make_learner(runner, LEARNER, args.lr)
        untrained_weights = learner.get_weights()
        log = ProgressLog(run_dir, list(PROGRESS_FIELDS), stack)

        env_steps = iteration = snapshots = 0
        start = time.perf_counter()
        add_snapshot(runner, matchmaker, learner, f"snap_{snapshots:04d}", args.pool_size)
        while env_steps < args.total_env_steps:
            iteration += 1
            lr = annealed_lr(args, env_steps)
            optimizer.param_groups[0]["lr"] = lr

            sample_start = time.perf_counter()
            batch = runner.sample(num_env_steps=args.steps_per_iteration)
            env_steps += batch.env_steps()
            train_start = time.perf_counter()
            learner_rows = batch.policy_batches[LEARNER]  # snapshots' rows are not trained on
            stats = ppo_update(learner, optimizer, learner_rows, args, rng)
            runner.set_weights({LEARNER: learner.get_weights()})
            if iteration % args.snapshot_every == 0:
                snapshots += 1
                add_snapshot(runner, matchmaker, learner, f"snap_{snapshots:04d}", args.pool_size)
            now = time.perf_counter()

            row = {
                "iteration": iteration,
                "env_steps": env_steps,
                "wall_s": round(now - start, 3),
                "sps": round(env_steps / (now - start), 1),  # moves/s: sampling, training, matches
                "sample_s": round(train_start - sample_start, 3),
                "train_s": round(now - train_start, 3),
                "learner_rows": len(learner_rows),
                "lr": lr,
                **results.pop_rates(),
                **matchmaker.pool_columns(),
                "vs_random_win": math.nan,
                "vs_bot_win": vs_bot_during_training(match_config, args, learner, iteration),
                **stats,
            }
            match = vs_random_during_training(match_config, args, learner, iteration)
            if match is not None:
                row["vs_random_win"] = match["win"]
            detail = (
                f"vs pool: win {row['pool_win']:.2f} draw {row['pool_draw']:.2f} "
                f"loss {row['pool_loss']:.2f} ({row['pool_games']} games)  pool {matchmaker.pool}"
            )
            if row["bot_games"]:
                detail += f"  vs bot: win {row['bot_win']:.2f} ({row['bot_games']} games)"
            if math.isfinite(row["vs_bot_win"]):
                detail += f"  vs bot, greedy: win {row['vs_bot_win']:.2f}"
            log.write(row, detail)
            if args.checkpoint_every and iteration % args.checkpoint_every == 0:
                save_checkpoint(runner, run_dir / "checkpoints" / f"iter_{iteration:05d}.ckpt")
            if on_iteration is not None:
                on_iteration(iteration, runner, list(matchmaker.pool), learner)
        save_checkpoint(runner, run_dir / "final.ckpt")
    train_wall_s = time.perf_counter() - start

    summary = {
        "config": str(args.config),
        "bot_share": args.bot_share,
        "env_steps": env_steps,
        "iterations": iteration,
        "snapshots_added": snapshots + 1,
        "pool": list(matchmaker.pool),
        "train_wall_s": round(train_wall_s, 1),
        "sps": round(env_steps / train_wall_s, 1),
    }
    plot = WinRatePlot(
        "win_rate_vs_pool.png",
        {
            "win % vs the pool": "pool_win",
            "loss % vs the pool": "pool_loss",
            f"win % vs RandomPolicy ({args.eval_games_during} games)": "vs_random_win",
            f"win % vs 1-ply bot, greedy ({args.eval_bot_games_during} games)": "vs_bot_win",
            "win % vs 1-ply bot, in training": "bot_win",
        },
        {
            "untrained vs RandomPolicy, sampled": "untrained_sampled",
            "trained vs RandomPolicy, sampled": "trained_sampled",
        },
        "Connect Four league: the learner against its pool of snapshots",
    )
    weights = (learner.get_weights(), untrained_weights)
    return finish_run(match_config, args, weights, run_dir, log.rows, summary, plot)


if __name__ == "__main__":
    main()
