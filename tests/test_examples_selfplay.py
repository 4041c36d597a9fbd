"""The Connect Four self-play and league examples, run end to end in their --smoke mode."""

from __future__ import annotations

import json
import math
import re
import sys

import numpy as np
import pytest

from examples import league_connect_four, selfplay_connect_four
from marl_runner import EnvRunner, MultiAgentBatch, SampleBatch, TorchPolicy, restore_checkpoint
from marl_runner.metrics_log import read_progress_csv

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_rates(result: dict, games: int) -> None:
    """Win/draw/loss rates are rates of ``games`` games and add up to 1."""
    assert result["games"] == games
    rates = [result[outcome] for outcome in ("win", "draw", "loss")]
    assert all(0.0 <= rate <= 1.0 for rate in rates), result
    assert math.isclose(sum(rates), 1.0), result
    assert all(math.isclose(rate * games, round(rate * games)) for rate in rates), result


def check_final_matches(matches: dict, games: int) -> None:
    """Trained and untrained, greedy and sampled: each ``games`` games, half in each seat."""
    assert set(matches) == {
        "trained_greedy",
        "trained_sampled",
        "untrained_greedy",
        "untrained_sampled",
    }
    for match in matches.values():
        check_rates(match, games)
        for seat in ("player_0", "player_1"):
            check_rates(match["per_seat"][seat], games // 2)
            assert match["per_seat"][seat]["rows_checked"] > 0


@pytest.mark.timeout(120)
def test_selfplay_smoke_trains_one_shared_policy_and_reports_per_seat(tmp_path, capsys) -> None:
    run_dir = tmp_path / "selfplay"
    summary = selfplay_connect_four.main(["--smoke", "--run-dir", str(run_dir)])
    assert "SPS" in capsys.readouterr().out

    rows = read_progress_csv(run_dir / "progress.csv")
    assert [row["iteration"] for row in rows] == list(range(1, len(rows) + 1))
    assert rows[-1]["env_steps"] == summary["env_steps"] >= 300
    for row in rows:
        assert math.isfinite(row["sps"]) and row["entropy"] > 0
    evaluated = [row["vs_random_win"] for row in rows if math.isfinite(row["vs_random_win"])]
    assert evaluated and all(0.0 <= win <= 1.0 for win in evaluated)
    assert (run_dir / "learning_curve.png").read_bytes().startswith(PNG_SIGNATURE)
    assert json.loads((run_dir / "summary.json").read_text()) == summary

    check_final_matches(summary["vs_random"], games=8)
    with restore_checkpoint(run_dir / "final.ckpt") as runner:
        assert list(runner.policy_map) == ["shared"]  # both seats, one policy


def test_the_mask_check_refuses_a_masked_move() -> None:
    rows = SampleBatch(
        {
            "actions": np.array([0, 6]),
            "action_mask": np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]], np.int8),
        }
    )
    with pytest.raises(AssertionError, match="column 6"):
        selfplay_connect_four.check_masks_honoured(MultiAgentBatch({"shared": rows}, 2))
    assert (
        selfplay_connect_four.check_masks_honoured(MultiAgentBatch({"s": rows.rows_slice(0, 1)}, 1))
        == 1
    )


class PoolWatch:
    """``on_iteration`` hook: checks the pool against the runner after every iteration."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.snapshot_weights: dict[str, dict] = {}  # weights when first seen in the pool
        self.learner_weights: list[dict] = []
        self.max_pool = 0

    def __call__(
        self, iteration: int, runner: EnvRunner, pool: list[str], learner: TorchPolicy
    ) -> None:
        self.max_pool = max(self.max_pool, len(pool))
        assert 1 <= len(pool) <= self.cap
        assert set(runner.policy_map) == set(runner.policy_map.policy_ids) == {"learner", *pool}
        for removed in set(self.snapshot_weights) - set(pool):
            assert removed not in runner.policy_map.policy_ids
        weights = runner.get_weights()
        assert_same_weights(weights["learner"], learner.get_weights())  # sampler is in sync
        for name in pool:
            # A snapshot is a frozen copy of the learner: new ones equal it, old ones never change.
            first_seen = self.snapshot_weights.setdefault(name, weights[name])
            assert_same_weights(weights[name], first_seen)
        self.learner_weights.append(weights["learner"])


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


@pytest.mark.timeout(120)
def test_league_smoke_keeps_the_pool_capped_and_trains_only_the_learner(tmp_path, capsys) -> None:
    run_dir = tmp_path / "league"
    watch = PoolWatch(cap=2)
    summary = league_connect_four.main(["--smoke", "--run-dir", str(run_dir)], on_iteration=watch)
    assert "SPS" in capsys.readouterr().out

    rows = read_progress_csv(run_dir / "progress.csv")
    assert len(rows) == summary["iterations"] == len(watch.learner_weights) >= 3
    # One snapshot per iteration in smoke mode, two kept: older ones were removed.
    assert summary["snapshots_added"] == summary["iterations"] + 1
    assert watch.max_pool == 2 and len(watch.snapshot_weights) == summary["snapshots_added"]
    for earlier, later in zip(watch.learner_weights, watch.learner_weights[1:]):
        assert any(not np.array_equal(earlier[k], later[k]) for k in earlier), "learner not trained"
    # Every snapshot was taken from the learner as it was at the end of some iteration.
    for name, weights in watch.snapshot_weights.items():
        if name != "snap_0000":
            index = int(name.split("_")[1]) - 1
            assert_same_weights(weights, watch.learner_weights[index])
    for row in rows:
        assert row["learner_rows"] > 0 and 1 <= row["pool_size"] <= 2
        assert row["pool_newest"] - row["pool_oldest"] == row["pool_size"] - 1
        if row["pool_games"]:
            check_rates(
                {
                    "win": row["pool_win"],
                    "draw": row["pool_draw"],
                    "loss": row["pool_loss"],
                    "games": row["pool_games"],
                },
                int(row["pool_games"]),
            )
    assert sum(row["pool_games"] for row in rows) > 0
    assert (run_dir / "win_rate_vs_pool.png").read_bytes().startswith(PNG_SIGNATURE)
    check_final_matches(summary["vs_random"], games=8)


PARSERS = {"selfplay": selfplay_connect_four.parse_args, "league": league_connect_four.parse_args}


@pytest.mark.parametrize("example", sorted(PARSERS))
@pytest.mark.parametrize("flag", ["--update-epochs", "--num-minibatches"])
def test_ppo_counts_below_one_are_refused(example: str, flag: str, capsys) -> None:
    with pytest.raises(SystemExit):
        PARSERS[example]([flag, "0"])
    assert f"{flag} 0: expected an int >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("example", sorted(PARSERS))
def test_help_shows_each_default_once(example: str, capsys) -> None:
    with pytest.raises(SystemExit):
        PARSERS[example](["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in help_text
    assert not re.search(r"default[^()]*\) \(default", help_text), help_text
    assert "(default: examples/configs/connect_four_selfplay.yaml)" in help_text
    assert f"(default: runs/{example}-<time>) --smoke" in help_text
    assert "minibatches per pass (default: 8)" in help_text  # set_defaults shows through


MAINS = {"selfplay": selfplay_connect_four.main, "league": league_connect_four.main}


@pytest.mark.parametrize("example", sorted(MAINS))
def test_without_matplotlib_it_stops_before_training(example: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    with pytest.raises(SystemExit, match=r"matplotlib .*pip install -e '\.\[plot\]'"):
        MAINS[example](["--smoke", "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("example", sorted(MAINS))
def test_the_summary_is_written_before_the_plot(example: str, tmp_path, monkeypatch) -> None:
    def failing_plot(*args, **kwargs):
        raise RuntimeError("plot failed")

    # Both examples draw with plot_win_rates, which calls the self-play module's import.
    monkeypatch.setattr(selfplay_connect_four, "plot_learning_curve", failing_plot)
    with pytest.raises(RuntimeError, match="plot failed"):
        MAINS[example](["--smoke", "--run-dir", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] == read_progress_csv(tmp_path / "progress.csv")[-1]["env_steps"]
    check_final_matches(summary["vs_random"], games=8)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_selfplay_without_periodic_matches_ends_without_a_curve(tmp_path, capsys) -> None:
    # --eval-every 0: no win rate during training, so no line to draw; the run still ends well.
    argv = ["--total-env-steps", "100", "--steps-per-iteration", "50", "--eval-every", "0"]
    argv += ["--eval-games", "4", "--num-envs", "2", "--run-dir", str(tmp_path)]
    summary = selfplay_connect_four.main(argv)
    assert "learning_curve.png not drawn" in capsys.readouterr().out
    assert not (tmp_path / "learning_curve.png").exists()
    rows = read_progress_csv(tmp_path / "progress.csv")
    assert rows and all(math.isnan(row["vs_random_win"]) for row in rows)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    check_final_matches(summary["vs_random"], games=4)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_league_with_the_bot_keeps_its_games_apart_and_measures_against_it(tmp_path) -> None:
    """--bot-share: some games are against the 1-ply bot, counted apart from the pool's; the
    final matches against the bot are greedy and sampled, half in each seat; the checkpoint
    plays the bot again through examples/connect_four_bots.py."""
    from examples import connect_four_bots

    run_dir = tmp_path / "league-bot"
    argv = ["--smoke", "--bot-share", "0.5", "--eval-bot-games-during", "4"]
    summary = league_connect_four.main(
        argv + ["--checkpoint-every", "2", "--run-dir", str(run_dir)]
    )
    rows = read_progress_csv(run_dir / "progress.csv")
    assert sum(row["bot_games"] for row in rows) > 0 and sum(row["pool_games"] for row in rows) > 0
    for row in rows:
        assert (row["bot_games"] > 0) == math.isfinite(row["bot_win"])
    measured = [row["vs_bot_win"] for row in rows if math.isfinite(row["vs_bot_win"])]
    assert measured and all(0.0 <= win <= 1.0 for win in measured)
    assert set(summary["vs_bot"]) == {"trained_greedy", "trained_sampled", "untrained_greedy"}
    for match in summary["vs_bot"].values():
        check_rates(match, 8)
        for seat in ("player_0", "player_1"):
            check_rates(match["per_seat"][seat], 4)
    check_final_matches(summary["vs_random"], games=8)
    assert (run_dir / "checkpoints" / "iter_00002.ckpt").exists()

    replay = connect_four_bots.main(["--games", "8", str(run_dir / "final.ckpt")])
    check_rates(replay, 8)


def test_a_bot_share_outside_zero_to_one_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        league_connect_four.parse_args(["--bot-share", "1.5"])
    assert "--bot-share 1.5: expected a share in [0, 1]" in capsys.readouterr().err
