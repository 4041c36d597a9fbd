"""Connect Four by self-play PPO: one shared policy plays both seats. Read it top to bottom.

PettingZoo's connect_four gives each player the board from its own point of
view (plane 0: the mover's discs, plane 1: the opponent's) and an
``action_mask`` of the columns that are not full. So one network can play
first and second: both seats map to the one policy ``shared`` of
``examples/configs/connect_four_selfplay.yaml``, and every game teaches it
both sides. Each iteration:

1. ``runner.sample(num_env_steps=...)``: whole games (``complete_episodes``);
   the runner's GAE has already added ``advantages`` and ``value_targets``.
   A win is +1 for the winner and -1 for the loser; the loser's -1 is given
   at the end of the game, after its last move, and the runner credits it to
   that move.
2. ``ppo_update`` from ``examples/train_ppo.py`` on all rows of both seats.
3. ``runner.set_weights``; every ``--eval-every`` iterations a short match
   against ``RandomPolicy`` is logged (the self-play reward itself is always
   0: one side's win is the other's loss).

At the end the trained weights, and for reference the untrained ones, play
``--eval-games`` games against ``RandomPolicy``, half in each seat, once
taking the most likely allowed move and once sampling; win/draw/loss rates
are reported per seat. Then ``--eval-bot-games`` against the 1-ply bot of
``examples/connect_four_bots.py`` (win at once, else block, else random), the
bar that means something. Every row of these matches is checked: the chosen
column must be allowed by the row's action mask.

Writes to ``--run-dir``: ``progress.csv``, ``learning_curve.png`` (win %
against RandomPolicy, and with ``--eval-bot-games-during`` against the bot,
over env steps, the final matches as reference lines),
``summary.json`` and ``final.ckpt`` (a runner checkpoint, for
``marl_runner.restore_checkpoint``). The plot needs matplotlib
(``pip install -e '.[plot]'``), checked at start-up; summary.json is written
before it is drawn.

    python examples/selfplay_connect_four.py --total-env-steps 300000
    python examples/selfplay_connect_four.py --smoke   # a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `examples.train_ppo` importable
    sys.path.insert(0, str(REPO))

from examples.connect_four_bots import BOT  # noqa: E402
from examples.train_ppo import (  # noqa: E402
    STAT_KEYS,
    HelpFormatter,
    ProgressLog,
    add_config_arguments,
    add_ppo_arguments,
    annealed_lr,
    check_ppo_arguments,
    make_config,
    make_run_dir,
    ppo_update,
    require_matplotlib,
)
from marl_runner import (  # noqa: E402
    Callbacks,
    EnvRunner,
    MultiAgentBatch,
    RunnerConfig,
    TorchPolicy,
    save_checkpoint,
)
from marl_runner.metrics_log import plot_learning_curve  # noqa: E402

CONFIG = REPO / "examples" / "configs" / "connect_four_selfplay.yaml"
SEATS = ("player_0", "player_1")
OUTCOMES = ("win", "draw", "loss")
PROGRESS_FIELDS = (  # progress.csv's columns, a row per iteration
    "iteration", "env_steps", "games", "wall_s", "sps", "sample_s", "train_s",
    "episode_len_mean", "lr", *STAT_KEYS, "vs_random_win", "vs_random_loss", "vs_bot_win",
)  # fmt: skip


def build_parser(description: str, run_name: str = "selfplay") -> argparse.ArgumentParser:
    """The flags of this example; ``examples/league_connect_four.py`` adds its own to them."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    # What to train on
    parser.add_argument(
        "--config",
        type=Path,
        default=CONFIG,
        help=f"runner config YAML (default: {CONFIG.relative_to(REPO).as_posix()})",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--seed", type=int, default=1, help="seeds the envs, the weights and the minibatch order"
    )
    # How long
    parser.add_argument(
        "--total-env-steps", type=int, default=300_000, help="stop after this many moves"
    )
    parser.add_argument(
        "--steps-per-iteration",
        type=int,
        default=4096,
        help="moves sampled per PPO update (whole games, so a few more)",
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=10,
        help="play a short match against RandomPolicy every this many iterations, moves "
        "sampled as in training (0: never)",
    )
    parser.add_argument(
        "--eval-games-during",
        type=int,
        default=100,
        help="games of each of those short matches (half in each seat)",
    )
    parser.add_argument(
        "--eval-games",
        type=int,
        default=200,
        help="games of the final match against RandomPolicy (half in each seat)",
    )
    parser.add_argument(
        "--eval-bot-games",
        type=int,
        default=400,
        help="games of the final matches against the 1-ply bot of examples/connect_four_bots.py "
        "(half in each seat; 0: none)",
    )
    parser.add_argument(
        "--eval-bot-games-during",
        type=int,
        default=0,
        help="every --eval-every iterations, also this many greedy-move games against the "
        "1-ply bot (half in each seat; 0: none)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help=f"where progress.csv, the plot and summary.json go (default: runs/{run_name}-<time>)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny step counts, to check the whole pipeline runs in a few seconds (CI)",
    )
    # Whole games go into batches (batch_mode complete_episodes): no fragment length to set.
    parser.set_defaults(fragment_length=None)  # read by examples.train_ppo.make_config
    # PPO hyper-parameters, read by examples.train_ppo.ppo_update (CleanRL's defaults, except a
    # higher learning rate, 8 minibatches and a small entropy bonus: measured on this game)
    add_ppo_arguments(parser)
    parser.set_defaults(lr=1e-3, num_minibatches=8, ent_coef=0.001)
    return parser


def finish_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parses ``argv``; ``--smoke`` shrinks every count so that a run takes seconds."""
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_envs, args.total_env_steps, args.steps_per_iteration = 4, 300, 100
        args.eval_every, args.eval_games_during, args.eval_games = 2, 4, 8
        args.eval_bot_games, args.eval_bot_games_during = 8, min(args.eval_bot_games_during, 4)
    for flag in ("total_env_steps", "steps_per_iteration", "eval_games_during", "eval_games"):
        if getattr(args, flag) < 2:
            parser.error(
                f"--{flag.replace('_', '-')} must be at least 2, got {getattr(args, flag)}"
            )
    for flag in ("eval_bot_games", "eval_bot_games_during"):
        if getattr(args, flag) == 1 or getattr(args, flag) < 0:
            parser.error(
                f"--{flag.replace('_', '-')} must be 0 or at least 2, got {getattr(args, flag)}"
            )
    check_ppo_arguments(parser, args)
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return finish_args(build_parser(__doc__.split("\n\n")[0]), argv)


# ---------------------------------------------------------------- evaluation


class GameResults(Callbacks):
    """Keeps the result of the first ``quota[env]`` games of each sub-env for ``policy_id``.

    A fixed number of games per sub-env, not the first N games to finish
    overall: those would favour short games.
    """

    def __init__(self, policy_id: str, quota: list[int]) -> None:
        self.policy_id = policy_id
        self.quota = quota
        self.results: list[float] = []
        self._per_env = [0] * len(quota)

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        if episode.faulty or self._per_env[episode.env_id] >= self.quota[episode.env_id]:
            return
        rewards = [r for (_, pid), r in episode.agent_rewards.items() if pid == self.policy_id]
        if len(rewards) != 1:
            raise AssertionError(
                f"expected {self.policy_id!r} in exactly one seat, got {episode.agent_rewards}"
            )
        self._per_env[episode.env_id] += 1
        self.results.append(rewards[0])

    @property
    def done(self) -> bool:
        return self._per_env == self.quota


def check_masks_honoured(batch: MultiAgentBatch) -> int:
    """Raises if any row's action is not allowed by its action mask; returns the rows checked."""
    checked = 0
    for policy_id, rows in batch.policy_batches.items():
        allowed = rows["action_mask"][np.arange(len(rows)), rows["actions"]]
        if not allowed.all():
            bad = int(np.flatnonzero(~allowed.astype(bool))[0])
            raise AssertionError(
                f"policy {policy_id!r} chose column {rows['actions'][bad]} against the action "
                f"mask {rows['action_mask'][bad].tolist()}"
            )
        checked += len(rows)
    return checked


def seat_mapping(seat: str, policy_id: str, opponent_id: str) -> Callable[..., str]:
    """``policy_id`` plays ``seat``, ``opponent_id`` the other seat."""

    def mapping(agent_id: str, episode: Any, **kwargs: Any) -> str:
        return policy_id if agent_id == seat else opponent_id

    return mapping


RANDOM_OPPONENT: dict[str, Any] = {"policy_class": "RandomPolicy"}


def play_vs(
    config: RunnerConfig,
    weights: dict[str, Any],
    games: int,
    seat: str,
    explore: bool,
    seed: int,
    opponent: dict[str, Any] | None = None,
    player: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``weights`` (one policy's) in ``seat`` against ``opponent`` for ``games`` games.

    ``player`` is the policy spec the weights belong to (default: the config's one policy),
    ``opponent`` a policy spec (default: RandomPolicy; ``examples.connect_four_bots`` has a
    1-ply bot). Returns the win/draw/loss rates, the games played and the rows whose mask
    was checked.
    """
    data = config.to_dict()
    if player is None:
        (player,) = data["policies"].values()
    config_of = player.get("config") or {}
    player = {**player, "config": {k: v for k, v in config_of.items() if k != "gae"}}
    num_envs = min(games, data["num_envs"])
    data.update(
        num_envs=num_envs,
        seed=seed,
        explore=explore,
        batch_mode="complete_episodes",
        policies={"trained": player, "opponent": opponent or RANDOM_OPPONENT},
        policy_mapping_fn=None,
    )
    results = GameResults(
        "trained", [games // num_envs + (e < games % num_envs) for e in range(num_envs)]
    )
    mapping = seat_mapping(seat, "trained", "opponent")
    rows_checked = 0
    with EnvRunner(
        RunnerConfig.from_dict(data), policy_mapping_fn=mapping, callbacks=results
    ) as runner:
        runner.set_weights({"trained": weights})
        while not results.done:
            for item in runner.step():
                if isinstance(item, MultiAgentBatch):
                    rows_checked += check_masks_honoured(item)
    outcomes = np.sign(results.results)
    return {
        "win": float(np.mean(outcomes > 0)),
        "draw": float(np.mean(outcomes == 0)),
        "loss": float(np.mean(outcomes < 0)),
        "games": len(outcomes),
        "rows_checked": rows_checked,
    }


def match_vs(
    config: RunnerConfig,
    weights: dict[str, Any],
    games: int,
    explore: bool,
    seed: int,
    opponent: dict[str, Any] | None = None,
    player: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``games`` games against ``opponent`` (default RandomPolicy), half in each seat:
    per-seat and overall rates; ``play_vs`` says what the arguments are."""
    per_seat = {
        seat: play_vs(config, weights, n, seat, explore, seed + i, opponent, player)
        for i, (seat, n) in enumerate(zip(SEATS, (games - games // 2, games // 2)))
    }
    total = sum(r["games"] for r in per_seat.values())
    overall = {o: sum(r[o] * r["games"] for r in per_seat.values()) / total for o in OUTCOMES}
    return {**overall, "games": total, "per_seat": per_seat}


def final_matches(
    config: RunnerConfig, trained: dict[str, Any], untrained: dict[str, Any], games: int, seed: int
) -> dict[str, dict[str, Any]]:
    """The trained and the untrained weights against RandomPolicy, taking the most likely
    allowed move (``greedy``) and sampling (``sampled``); same games and seeds for all four.

    The untrained rows are the reference: a greedy untrained network tends to stack
    discs in one column, which already beats a random player most of the time.
    """
    return {
        f"{who}_{mode}": match_vs(config, weights, games, mode == "sampled", seed)
        for who, weights in (("trained", trained), ("untrained", untrained))
        for mode in ("greedy", "sampled")
    }


def print_matches(matches: dict[str, dict[str, Any]], opponent: str = "RandomPolicy") -> None:
    """One line per match against ``opponent``: overall and per-seat win/draw/loss rates."""
    for name, match in matches.items():
        seats = "  ".join(
            f"as {seat}: {r['win']:.3f}/{r['draw']:.3f}/{r['loss']:.3f}"
            for seat, r in match["per_seat"].items()
        )
        print(
            f"{name:17s} vs {opponent}, win/draw/loss over {match['games']} games: "
            f"{match['win']:.3f}/{match['draw']:.3f}/{match['loss']:.3f}  ({seats})"
        )
    print("every move of every match was allowed by its action mask")


def plot_win_rates(
    rows: list[dict[str, Any]],
    path: Path,
    lines: dict[str, str],
    baselines: dict[str, float],
    title: str,
) -> None:
    """Plots ``lines`` (label -> progress column holding a rate) and ``baselines`` in percent.

    Lines without a single value (``--eval-every 0``: no periodic match) are left out;
    with none left there is no curve to draw, and it says so instead of failing.
    """
    lines = {
        label: column
        for label, column in lines.items()
        if any(math.isfinite(row[column]) for row in rows)
    }
    if not lines:
        print(f"no win rate was measured during training: {path.name} not drawn")
        return
    percent_rows = [
        {"env_steps": row["env_steps"], **{label: 100 * row[col] for label, col in lines.items()}}
        for row in rows
    ]
    plot_learning_curve(
        percent_rows,
        path,
        y=list(lines),
        baselines={label: 100 * rate for label, rate in baselines.items()},
        title=title,
    )


class WinRatePlot(NamedTuple):
    """What ``finish_run`` draws: ``lines`` (label -> progress column) and ``baselines``
    (label -> final match name, e.g. ``trained_sampled``) as win percentages."""

    file_name: str
    lines: dict[str, str]
    baselines: dict[str, str]
    title: str


def vs_random_during_training(
    config: RunnerConfig, args: argparse.Namespace, learner: TorchPolicy, iteration: int
) -> dict[str, Any] | None:
    """Every ``--eval-every`` iterations, ``--eval-games-during`` sampled-move games against
    RandomPolicy (seeded per iteration); None in between or with ``--eval-every 0``."""
    if not args.eval_every or iteration % args.eval_every:
        return None
    return match_vs(
        config,
        learner.get_weights(),
        args.eval_games_during,
        explore=True,
        seed=args.seed + 1000 * iteration,
    )


def bot_opponent(seed: int) -> dict[str, Any]:
    """The policy spec of the 1-ply bot (``examples.connect_four_bots``), its moves seeded."""
    return {"policy_class": BOT, "config": {"seed": seed}}


def vs_bot_during_training(
    config: RunnerConfig, args: argparse.Namespace, learner: TorchPolicy, iteration: int
) -> float:
    """Every ``--eval-every`` iterations, the win rate of ``--eval-bot-games-during``
    greedy-move games against the 1-ply bot; NaN in between or when those flags are 0."""
    if not (args.eval_every and args.eval_bot_games_during) or iteration % args.eval_every:
        return math.nan
    seed = args.seed + 1000 * iteration + 500
    match = match_vs(
        config, learner.get_weights(), args.eval_bot_games_during, False, seed, bot_opponent(seed)
    )
    return match["win"]


def bot_matches(
    config: RunnerConfig, trained: dict[str, Any], untrained: dict[str, Any], games: int, seed: int
) -> dict[str, dict[str, Any]]:
    """The trained weights against the 1-ply bot, greedy and sampled, and the untrained
    ones greedy; same games and seeds for all three (none with ``games`` 0)."""
    if not games:
        return {}
    plays = (
        ("trained", trained, False),
        ("trained", trained, True),
        ("untrained", untrained, False),
    )
    return {
        f"{who}_{'sampled' if explore else 'greedy'}": match_vs(
            config, weights, games, explore, seed, bot_opponent(seed)
        )
        for who, weights, explore in plays
    }


def finish_run(
    config: RunnerConfig,
    args: argparse.Namespace,
    weights: tuple[dict[str, Any], dict[str, Any]],
    run_dir: Path,
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    plot: WinRatePlot,
) -> dict[str, Any]:
    """The run's tail, shared with the league: the final matches of the (trained, untrained)
    ``weights`` against RandomPolicy and against the 1-ply bot, ``summary`` plus them as
    summary.json (written before the plot), the win-rate plot, the summary printed;
    returns the summary."""
    final = final_matches(config, *weights, args.eval_games, args.seed + 10_000)
    print_matches(final)
    vs_bot = bot_matches(config, *weights, args.eval_bot_games, args.seed + 20_000)
    if vs_bot:
        print_matches(vs_bot, "1-ply bot")
    summary = {**summary, "vs_random": final, "vs_bot": vs_bot}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    baselines = {label: final[match]["win"] for label, match in plot.baselines.items()}
    plot_win_rates(rows, run_dir / plot.file_name, plot.lines, baselines, title=plot.title)
    print(json.dumps(summary, indent=2))
    return summary


# ---------------------------------------------------------------- training


def make_learner(
    runner: EnvRunner, policy_id: str, lr: float
) -> tuple[TorchPolicy, torch.optim.Optimizer]:
    """A learner copy of the runner's TorchPolicy ``policy_id`` and its Adam; training never
    touches the sampler's weights directly. Shared with the league."""
    policy = runner.policy_map[policy_id]
    if not isinstance(policy, TorchPolicy):
        raise ValueError(
            f"policy {policy_id!r}: expected a TorchPolicy to train, got {type(policy).__name__}"
        )
    learner = TorchPolicy(*runner.get_spaces()[policy_id], policy.config)
    learner.set_weights(policy.get_weights())
    return learner, torch.optim.Adam(learner.parameters(), lr=lr, eps=1e-5)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    require_matplotlib()
    config = make_config(args)
    run_dir = make_run_dir(args.run_dir, "selfplay")
    rng = np.random.default_rng(args.seed)

    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(EnvRunner(config))
        (policy_id,) = runner.policy_map  # both seats
        learner, optimizer = make_learner(runner, policy_id, args.lr)
        untrained_weights = learner.get_weights()
        log = ProgressLog(run_dir, list(PROGRESS_FIELDS), stack)

        env_steps = games = iteration = 0
        start = time.perf_counter()
        while env_steps < args.total_env_steps:
            iteration += 1
            lr = annealed_lr(args, env_steps)
            optimizer.param_groups[0]["lr"] = lr

            sample_start = time.perf_counter()
            batch = runner.sample(num_env_steps=args.steps_per_iteration)
            metrics = runner.get_metrics()
            env_steps += batch.env_steps()
            games += metrics["episodes"]

            train_start = time.perf_counter()
            stats = ppo_update(learner, optimizer, batch.policy_batches[policy_id], args, rng)
            runner.set_weights({policy_id: learner.get_weights()})
            now = time.perf_counter()

            row = {
                "iteration": iteration,
                "env_steps": env_steps,
                "games": games,
                "wall_s": round(now - start, 3),
                "sps": round(env_steps / (now - start), 1),  # moves/s: sampling, training, matches
                "sample_s": round(train_start - sample_start, 3),
                "train_s": round(now - train_start, 3),
                "episode_len_mean": metrics["episode_len_mean"],
                "lr": lr,
                **stats,
                "vs_random_win": math.nan,
                "vs_random_loss": math.nan,
                "vs_bot_win": vs_bot_during_training(config, args, learner, iteration),
            }
            detail = f"game length {row['episode_len_mean']:5.1f}  entropy {stats['entropy']:.3f}"
            match = vs_random_during_training(config, args, learner, iteration)
            if match is not None:
                row["vs_random_win"], row["vs_random_loss"] = match["win"], match["loss"]
                detail += f"  vs random: win {match['win']:.2f}"
            if math.isfinite(row["vs_bot_win"]):
                detail += f"  vs 1-ply bot: win {row['vs_bot_win']:.2f}"
            log.write(row, detail)
        save_checkpoint(runner, run_dir / "final.ckpt")
    train_wall_s = time.perf_counter() - start

    summary = {
        "config": str(args.config),
        "env_steps": env_steps,
        "games": games,
        "iterations": iteration,
        "train_wall_s": round(train_wall_s, 1),
        "sps": round(env_steps / train_wall_s, 1),
    }
    plot = WinRatePlot(
        "learning_curve.png",
        {
            f"vs RandomPolicy, sampled moves, {args.eval_games_during} games": "vs_random_win",
            f"vs 1-ply bot, greedy moves, {args.eval_bot_games_during} games": "vs_bot_win",
        },
        {
            f"{who}, {mode}": f"{who}_{mode}"
            for who in ("untrained", "trained")
            for mode in ("sampled", "greedy")
        },
        "Connect Four self-play PPO: win %",
    )
    weights = (learner.get_weights(), untrained_weights)
    return finish_run(config, args, weights, run_dir, log.rows, summary, plot)


if __name__ == "__main__":
    main()
