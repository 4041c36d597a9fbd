"""A pool of policies that changes between samples: add_policy / remove_policy with games running.

Connect Four, whole games per batch: ``learner`` plays ``player_0``, the
opponent of each game is drawn from a pool that is changed while games are
half played, as a league does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from marl_runner import Callbacks, EnvRunner, RunnerConfig, TorchPolicy, check_batch_invariants

MLP = {"model": {"type": "mlp", "hidden": [16]}}


class PoolMapping:
    """``player_0`` -> learner; ``player_1`` -> the game's opponent, drawn once per game.

    When a game's opponent has left the pool it asks ``replace`` for a new one.
    """

    def __init__(self, pool: list[str]) -> None:
        self.pool = pool
        self.rng = np.random.default_rng(0)
        self.replace = lambda episode: self.pool[-1]

    def __call__(self, agent_id: str, episode: Any, **kwargs: Any) -> str:
        if agent_id == "player_0":
            return "learner"
        opponent = episode.user_data.get("opponent")
        if opponent is None:
            opponent = self.pool[int(self.rng.integers(len(self.pool)))]
        elif opponent not in self.pool:
            opponent = self.replace(episode)
        episode.user_data["opponent"] = opponent
        return opponent


class RunningEpisodes(Callbacks):
    """The episodes started and not ended yet."""

    def __init__(self) -> None:
        self.episodes: dict[int, Any] = {}

    def on_episode_start(self, *, episode: Any, **kwargs: Any) -> None:
        self.episodes[id(episode)] = episode

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        self.episodes.pop(id(episode), None)


def make_runner(mapping: PoolMapping) -> EnvRunner:
    config = RunnerConfig.from_dict(
        {
            "env": {"name": "pettingzoo.classic.connect_four_v3:env", "api": "aec"},
            "num_envs": 6,
            "batch_mode": "complete_episodes",
            "seed": 3,
            "policies": {"learner": MLP, "snap_a": MLP, "snap_b": MLP},
        }
    )
    return EnvRunner(config, policy_mapping_fn=mapping, callbacks=RunningEpisodes())


def play_until_opponents_moved(runner: EnvRunner, policy_id: str) -> list[Any]:
    """Steps until several games are half played with ``policy_id`` already having moved."""
    for _ in range(200):
        batches = [item for item in runner.step() if hasattr(item, "policy_batches")]
        assert not batches, "a game ended before the pool was changed; pick another seed"
        running = [
            ep
            for ep in runner.callbacks.episodes.values()
            if any(s.policy_id == policy_id for s in ep.slots.values())
        ]
        if len(running) >= 2:
            return running
    raise AssertionError(f"no two running games with {policy_id!r} moved")


def finish_games(runner: EnvRunner, num_episodes: int = 12) -> dict[str, Any]:
    """Samples whole games; every trajectory in them must be whole (t from 0, no gaps)."""
    batch = runner.sample(num_episodes=num_episodes)
    check_batch_invariants(batch)
    return batch.policy_batches


def splitting_replacement(episode: Any) -> str:
    """Sends the removed policy's agents to two different policies: not allowed."""
    return "learner" if episode.env_id % 2 else "snap_b"


def raising_replacement(episode: Any) -> str:
    raise RuntimeError("matchmaker failed")


@pytest.mark.parametrize(
    ("replacement", "error"),
    [(splitting_replacement, ValueError), (raising_replacement, RuntimeError)],
)
def test_a_refused_removal_changes_nothing(replacement, error) -> None:
    pool = ["snap_a", "snap_b"]
    mapping = PoolMapping(pool)
    with make_runner(mapping) as runner:
        running = play_until_opponents_moved(runner, "snap_a")
        seats_before = {ep.env_id: dict(ep.agent_rewards) for ep in running}
        mapping.replace = replacement
        pool.remove("snap_a")
        with pytest.raises(error):
            runner.remove_policy("snap_a")
        pool.insert(0, "snap_a")

        assert "snap_a" in runner.policy_map and "snap_a" in runner.policy_map.policy_ids
        for ep in running:  # every agent still plays the policy it had
            assert dict(ep.agent_rewards).keys() == seats_before[ep.env_id].keys()
        # The half-played games end under their old policies, their trajectories whole.
        policy_batches = finish_games(runner)
        assert "snap_a" in policy_batches


def test_removing_a_policy_mid_game_hands_its_games_to_one_policy() -> None:
    pool = ["snap_a", "snap_b"]
    mapping = PoolMapping(pool)
    with make_runner(mapping) as runner:
        running = play_until_opponents_moved(runner, "snap_a")
        pool.remove("snap_a")
        runner.remove_policy("snap_a")

        assert "snap_a" not in runner.policy_map and "snap_a" not in runner.policy_map.policy_ids
        for ep in running:
            assert ep.slots["player_1"].policy_id == "snap_b"
        policy_batches = finish_games(runner)  # snap_b took the games over: whole trajectories
        assert "snap_a" not in policy_batches
        assert set(policy_batches) == {"learner", "snap_b"}


def test_a_policy_added_with_its_spaces_is_built_and_playable_at_once() -> None:
    pool = ["snap_a"]
    mapping = PoolMapping(pool)
    with make_runner(mapping) as runner:
        spaces = {
            "observation_space": runner.env.get_observation_space("player_1"),
            "action_space": runner.env.get_action_space("player_1"),
        }
        added = runner.add_policy("snap_c", {**MLP, **spaces})
        assert added is runner.policy_map["snap_c"]
        runner.set_weights({"snap_c": runner.get_weights()["learner"]})
        pool[:] = ["snap_c"]
        runner.remove_policy("snap_a")
        policy_batches = finish_games(runner)
        assert "snap_c" in policy_batches
        assert_same_weights(runner.get_weights()["snap_c"], runner.get_weights()["learner"])


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


def test_a_ready_made_policy_added_before_any_agent_maps_to_it_plays_the_env() -> None:
    """Its connectors are first built for its own (flattened) space; the first agent that
    maps to it brings the env's Dict space, and they are rebuilt for it, weights kept."""
    pool = ["snap_a"]
    mapping = PoolMapping(pool)
    with make_runner(mapping) as runner:
        learner = runner.policy_map["learner"]
        frozen = TorchPolicy(learner.observation_space, learner.action_space, learner.config)
        frozen.set_weights(learner.get_weights())
        assert runner.add_policy("frozen", frozen) is frozen
        pool[:] = ["frozen"]
        runner.remove_policy("snap_a")
        policy_batches = finish_games(runner)
        assert runner.policy_map["frozen"] is frozen
        assert (
            policy_batches["frozen"]["obs"].shape[1:] == policy_batches["learner"]["obs"].shape[1:]
        )
        assert_same_weights(frozen.get_weights(), learner.get_weights())
