"""A custom policy mapping function: a learner takes a random seat each episode.

Shows: ``learner_vs_random(agent_id, episode, **kwargs)``, the signature the
runner calls once per agent per episode. In tic-tac-toe the player moving
first has the easier game, so a learner that always sat in one seat would
learn only half of it. Here each episode draws the learner's seat; the
other seat plays ``random`` (a ``RandomPolicy``, ``policy_class:
RandomPolicy`` in ``examples/configs/tictactoe_vs_random.yaml``). Both
agents of an episode must agree on the draw, and the runner asks once per
agent, so the draw is seeded by ``episode.episode_id`` instead of being
remembered between calls: the same episode always gives the same answer.

Run from the repository root:

    python examples/custom_mapping.py
    marl-runner sample examples/configs/tictactoe_vs_random.yaml --episodes 100

It prints, per seat, how many games the learner played there and its
wins/draws/losses (the learner is untrained here, so about as good as random).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "tictactoe_vs_random.yaml"
SEATS = ("player_1", "player_2")  # PettingZoo's tic-tac-toe agents; player_1 moves first


def learner_vs_random(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """``learner`` for the episode's drawn seat, ``random`` for the other one."""
    if agent_id not in SEATS:
        raise ValueError(f"learner_vs_random expects one of {SEATS}, got {agent_id!r}")
    learner_seat = random.Random(episode.episode_id).choice(SEATS)
    return "learner" if agent_id == learner_seat else "random"


def learner_games(batch: Any) -> dict[int, tuple[int, float]]:
    """Per episode in ``batch``: ``(learner's agent_index, its total reward)``.

    ``agent_index`` is the order in which agents first observed, so 0 means
    the learner moved first. A win is +1, a loss -1, a draw 0.
    """
    rows = batch.policy_batches["learner"]
    games: dict[int, tuple[int, float]] = {}
    for eps_id in np.unique(rows["eps_id"]):
        mine = rows["eps_id"] == eps_id
        (index,) = np.unique(rows["agent_index"][mine])  # one seat per episode
        games[int(eps_id)] = (int(index), float(rows["rewards"][mine].sum()))
    return games


def main(argv: list[str] | None = None) -> dict[int, tuple[int, float]]:
    """Samples whole games; returns ``learner_games`` of the batch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--episodes",
        type=int,
        default=200,
        help="at least this many games: the sub-envs step together and every game that "
        "ends in the last round counts, so often a few more",
    )
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:  # the config names "examples.custom_mapping:..."
        sys.path.insert(0, str(REPO))
    from marl_runner import EnvRunner, RunnerConfig, check_batch_invariants

    with EnvRunner(RunnerConfig.from_yaml(CONFIG)) as runner:
        batch = runner.sample(num_episodes=args.episodes)
    check_batch_invariants(batch)
    games = learner_games(batch)
    print(f"{len(games)} games; the learner's results by seat:")
    for index, seat in enumerate(SEATS):
        results = [reward for seat_index, reward in games.values() if seat_index == index]
        wins, losses = sum(r > 0 for r in results), sum(r < 0 for r in results)
        print(
            f"  {seat} ({'first' if index == 0 else 'second'}): {len(results):4d} games, "
            f"{wins} won, {len(results) - wins - losses} drawn, {losses} lost"
        )
    return games


if __name__ == "__main__":
    main()
