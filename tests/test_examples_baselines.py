"""The scripted reference policies of the examples: the greedy simple_spread controller and
the 1-ply Connect Four bot, on hand-made positions and in the real PettingZoo envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from examples import connect_four_bots, scripted_spread, selfplay_connect_four
from examples.train_ppo import add_import_paths
from marl_runner import RunnerConfig

add_import_paths()  # configs name the policies by import path

BOARD_SPACE = gym.spaces.Box(0.0, 1.0, (84,), np.float32)
COLUMNS = gym.spaces.Discrete(7)


def board(mine: list[tuple[int, int]], theirs: list[tuple[int, int]]) -> np.ndarray:
    """The mover's view: plane 0 its discs, plane 1 the opponent's, (row, column), row 5 at
    the bottom; flattened as the runner hands it to a policy."""
    cells = np.zeros((6, 7, 2), np.float32)
    for row, col in mine:
        cells[row, col, 0] = 1
    for row, col in theirs:
        cells[row, col, 1] = 1
    return cells.reshape(-1)


def bot_moves(boards: list[np.ndarray], masks: list[list[int]] | None = None, seed: int = 0):
    bot = connect_four_bots.OnePlyBot(BOARD_SPACE, COLUMNS, {"seed": seed})
    mask = np.ones((len(boards), 7), np.int8) if masks is None else np.array(masks, np.int8)
    actions, state, extra = bot.compute_actions_from_input_dict(
        {"obs": np.stack(boards), "action_mask": mask}
    )
    assert state == [] and extra == {}
    return actions


def test_the_bot_wins_at_once_in_every_direction() -> None:
    horizontal = board([(5, 0), (5, 1), (5, 2)], [(4, 0), (4, 1), (4, 2)])
    vertical = board([(5, 6), (4, 6), (3, 6)], [(5, 0), (5, 1), (4, 0)])
    # Diagonal up to the right ending at (2, 3): its cell lands only once column 3 has 3 discs.
    diagonal = board(
        [(5, 0), (4, 1), (3, 2)],
        [(5, 1), (5, 2), (4, 2), (5, 3), (4, 3), (3, 3)],
    )
    assert bot_moves([horizontal, vertical, diagonal]).tolist() == [3, 6, 3]


def test_the_bot_blocks_unless_it_can_win_and_never_plays_a_full_column() -> None:
    threat = board([(5, 0), (4, 0)], [(5, 3), (5, 4), (5, 5)])  # they win at column 2 or 6
    blocks = bot_moves([threat] * 40, seed=1)
    assert set(blocks.tolist()) == {2, 6}  # either block, drawn at random
    both = board([(5, 0), (4, 0), (3, 0)], [(5, 3), (5, 4), (5, 5)])
    assert bot_moves([both]).tolist() == [0]  # its own win comes first
    # A win whose column is masked is not played: the block is.
    assert bot_moves([both], [[0, 1, 1, 1, 1, 1, 1]]).tolist() in ([2], [6])
    quiet = board([(5, 0)], [(5, 6)])
    mask = [[0, 1, 0, 1, 0, 1, 0]]
    moves = bot_moves([quiet] * 60, mask * 60, seed=2)
    assert set(moves.tolist()) == {1, 3, 5}  # random among the allowed columns


def test_a_landing_cell_must_be_reachable() -> None:
    # Three in a row on row 3; the winning cell (3, 3) floats above an empty column 3.
    floating = board([(3, 0), (3, 1), (3, 2)], [(5, 0), (4, 0), (5, 1), (4, 1), (5, 2), (4, 2)])
    rows = connect_four_bots.landing_rows(floating.reshape(1, 6, 7, 2))
    assert rows[0].tolist() == [2, 2, 2, 5, 5, 5, 5]
    wins = connect_four_bots.wins_by_dropping(floating.reshape(1, 6, 7, 2)[..., 0], rows)
    assert not wins.any()


def test_the_bot_refuses_another_game() -> None:
    with pytest.raises(ValueError, match="connect_four's observation"):
        connect_four_bots.OnePlyBot(gym.spaces.Box(0, 1, (18,)), COLUMNS)


@pytest.mark.timeout(60)
def test_random_play_rarely_beats_the_bot_in_the_real_game() -> None:
    config = RunnerConfig.from_yaml(selfplay_connect_four.CONFIG)
    bot = selfplay_connect_four.bot_opponent(seed=3)
    match = selfplay_connect_four.match_vs(
        config, {}, 40, True, 3, bot, {"policy_class": "RandomPolicy"}
    )
    assert match["games"] == 40 and match["win"] <= 0.25, match
    for seat in selfplay_connect_four.SEATS:
        assert match["per_seat"][seat]["rows_checked"] > 0  # every move checked against its mask


def spread_obs(vel, pos, landmarks, others) -> np.ndarray:
    """simple_spread's observation of one agent, landmarks and others given absolutely."""
    rel = lambda points: (np.array(points, float) - pos).reshape(-1)  # noqa: E731
    return np.concatenate([vel, pos, rel(landmarks), rel(others), np.zeros(4)]).astype(np.float32)


def spread_moves(rows: list[np.ndarray]) -> list[int]:
    policy = scripted_spread.GreedySpreadPolicy(
        gym.spaces.Box(-np.inf, np.inf, (18,), np.float32), gym.spaces.Discrete(5)
    )
    actions, _, _ = policy.compute_actions_from_input_dict({"obs": np.stack(rows)})
    return actions.tolist()


def test_each_agent_heads_for_its_own_landmark_and_brakes() -> None:
    landmarks = [(-0.8, 0.0), (0.0, 0.8), (0.8, 0.0)]
    agents = [(-0.5, 0.0), (0.0, 0.5), (0.5, 0.0)]  # each nearest its own landmark
    rows = [
        spread_obs(np.zeros(2), np.array(me), landmarks, [a for a in agents if a != me])
        for me in agents
    ]
    assert spread_moves(rows) == [1, 4, 2]  # -x, +y, +x: three different landmarks
    # Racing towards its landmark at full speed: it stops pushing (or pushes back).
    fast = spread_obs(np.array([-1.0, 0.0]), np.array(agents[0]), landmarks, agents[1:])
    assert spread_moves([fast]) in ([0], [2])


def test_the_controller_refuses_another_env() -> None:
    with pytest.raises(ValueError, match="simple_spread's observation"):
        scripted_spread.GreedySpreadPolicy(gym.spaces.Box(0, 1, (84,)), COLUMNS)


@pytest.mark.timeout(60)
def test_the_controller_beats_random_on_the_same_episodes() -> None:
    config = RunnerConfig.from_yaml(scripted_spread.CONFIG)
    rewards = {
        name: scripted_spread.episode_rewards(
            scripted_spread.with_policy_class(config, policy_class), 16, seed=5
        )
        for name, policy_class in (
            ("random", "RandomPolicy"),
            ("scripted", scripted_spread.SCRIPTED),
        )
    }
    assert len(rewards["random"]) == len(rewards["scripted"]) == 16
    # About -80 and -25 on average (docs/TRAINING.md); far apart on 16 episodes.
    assert rewards["scripted"].mean() > rewards["random"].mean() + 30, rewards
    assert rewards["scripted"].mean() > -40


@pytest.mark.timeout(60)
def test_the_spread_evaluation_scores_random_and_scripted_alike(tmp_path) -> None:
    out = tmp_path / "eval.json"
    results = scripted_spread.main(["--episodes", "6", "--out", str(out)])
    assert set(results) == {"random", "scripted"}
    for result in results.values():
        assert result["episodes"] == 6 and result["std"] >= 0
        assert result["sem"] == pytest.approx(result["std"] / 6**0.5, abs=0.01)
    assert out.read_text().startswith("{")
