"""A 1-ply Connect Four bot, and the match that measures a trained policy against it.

``OnePlyBot`` is the bar of docs/SELFPLAY.md: it wins at once if it can, else
blocks the opponent's immediate win, else plays a random legal column. It
reads PettingZoo's connect_four observation as the runner hands it to a
policy: the (6, 7, 2) board flattened, plane 0 the mover's discs, plane 1
the opponent's, row 5 the bottom; and the ``action_mask`` of open columns.
Config ``seed`` seeds its random moves.

Run as a script it plays a checkpoint's policy (or, without one, a random
player) against the bot: ``--games`` games, half as first player, half as
second, moves greedy (the most likely allowed column) unless ``--sampled``;
every move is checked against its action mask.

    python examples/connect_four_bots.py --games 400 runs/league-bot-s1/final.ckpt
    python examples/connect_four_bots.py --games 400      # RandomPolicy against the bot
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
if str(REPO) not in sys.path:  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(REPO))

from marl_runner.policy.base import Policy, PolicyOutput  # noqa: E402

ROWS, COLUMNS = 6, 7
BOT = "examples.connect_four_bots:OnePlyBot"


def _winning_lines() -> np.ndarray:
    """The 69 lines of four cells, as flat cell indices ``row * 7 + column``: ``[69, 4]``."""
    lines = []
    for row, col in itertools.product(range(ROWS), range(COLUMNS)):
        for d_row, d_col in ((0, 1), (1, 0), (1, 1), (1, -1)):
            cells = [(row + k * d_row, col + k * d_col) for k in range(4)]
            if all(0 <= r < ROWS and 0 <= c < COLUMNS for r, c in cells):
                lines.append([r * COLUMNS + c for r, c in cells])
    return np.array(lines)


LINES = _winning_lines()


def landing_rows(boards: np.ndarray) -> np.ndarray:
    """``[n, 7]``: the row a disc dropped in each column lands on (-1: the column is full).

    ``boards`` is ``[n, 6, 7, 2]``; a cell is empty when neither plane has a disc.
    """
    empty = boards.sum(-1) == 0  # [n, 6, 7]
    lowest_empty = ROWS - 1 - np.argmax(empty[:, ::-1, :], axis=1)  # bottom-most empty row
    return np.where(empty.any(1), lowest_empty, -1)


def wins_by_dropping(discs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``[n, 7]``: whether a disc dropped in each column would complete a line of ``discs``.

    ``discs`` is one player's ``[n, 6, 7]`` plane, ``rows`` what ``landing_rows`` returns.
    """
    n = len(discs)
    after = np.repeat(discs.reshape(n, 1, ROWS * COLUMNS).astype(bool), COLUMNS, axis=1)
    column = np.arange(COLUMNS)
    open_rows, open_cols = np.nonzero(rows >= 0)
    after[open_rows, open_cols, rows[open_rows, open_cols] * COLUMNS + column[open_cols]] = True
    wins = after[:, :, LINES].all(-1).any(-1)  # [n, 7]
    return wins & (rows >= 0)


class OnePlyBot(Policy):
    """Win now, else block the opponent's win now, else a random allowed column."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, config)
        if int(np.prod(observation_space.shape)) != ROWS * COLUMNS * 2 or not (
            isinstance(action_space, gym.spaces.Discrete) and action_space.n == COLUMNS
        ):
            raise ValueError(
                "OnePlyBot needs connect_four's observation (84 values: 6x7 board, 2 planes) "
                f"and its 7 columns, got {observation_space} and {action_space}"
            )
        self._rng = np.random.default_rng(self.config.get("seed"))

    def compute_actions_from_input_dict(
        self,
        input_dict: Mapping[str, Any],
        explore: bool | None = None,
        timestep: int | None = None,
    ) -> PolicyOutput:
        """For each row: a random column among the winning ones, else among the blocking
        ones, else among the allowed ones."""
        boards = np.asarray(input_dict["obs"]).reshape(-1, ROWS, COLUMNS, 2)
        allowed = np.asarray(input_dict["action_mask"]).astype(bool)
        rows = landing_rows(boards)
        win = wins_by_dropping(boards[..., 0], rows) & allowed
        block = wins_by_dropping(boards[..., 1], rows) & allowed
        fallback = np.where(block.any(1, keepdims=True), block, allowed)
        choice = np.where(win.any(1, keepdims=True), win, fallback)
        scores = np.where(choice, self._rng.random(choice.shape), -1.0)
        return scores.argmax(1).astype(self.action_space.dtype), [], {}

    def get_state(self) -> dict[str, Any]:
        """No weights; the generator state, so that a restored bot draws the same moves."""
        return {"weights": {}, "rng_state": self._rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if "rng_state" in state:
            self._rng.bit_generator.state = state["rng_state"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from examples.selfplay_connect_four import CONFIG, match_vs, print_matches
    from examples.train_ppo import add_import_paths
    from marl_runner import RunnerConfig
    from marl_runner.checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", nargs="?", type=Path, default=None,
        help="a runner checkpoint of one trained policy (default: RandomPolicy plays)",
    )  # fmt: skip
    parser.add_argument(
        "--policy",
        default=None,
        help="the checkpoint's policy to play (default: its first TorchPolicy)",
    )
    parser.add_argument("--games", type=int, default=400, help="games, half in each seat")
    parser.add_argument("--sampled", action="store_true", help="sample moves instead of greedy")
    parser.add_argument("--seed", type=int, default=20_000, help="seeds the games and the bot")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.games < 2:
        parser.error(f"--games {args.games}: expected an int >= 2")
    add_import_paths()
    config = RunnerConfig.from_yaml(CONFIG)
    if args.checkpoint is None:
        player, weights = {"policy_class": "RandomPolicy"}, {}
    else:
        # Read as data: the policy's spec and weights (a league's checkpoint also holds its
        # snapshots and the bot, and its mapping was a function of the run).
        payload = load_checkpoint(args.checkpoint)
        specs = payload["config"]["policies"]
        trainable = [
            pid for pid, spec in specs.items() if spec.get("policy_class") in (None, "TorchPolicy")
        ]
        policy_id = args.policy or trainable[0]
        player, weights = specs[policy_id], payload["policies"][policy_id]["weights"]
    opponent = {"policy_class": BOT, "config": {"seed": args.seed}}
    result = match_vs(config, weights, args.games, args.sampled, args.seed, opponent, player)
    print_matches({"vs one-ply bot": result}, "the one-ply bot")
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
