"""MAgent2 battle_v4, a population env whose agents die: batch invariants, rewards
conserved per (episode, agent) against the env's own, deaths mid-episode, and subprocess
sub-envs giving the same batches as sync ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from marl_runner import EnvRunner, check_batch_invariants, concat_samples
from marl_runner.policy import RandomPolicy
from tests.runner_helpers import EpisodeTracker, assert_rewards_conserved, config, logged_env_name

BATTLE = "magent2.environments.battle_v4:parallel_env"
# The smallest map: 2 agents a side, face to face after two moves.
ENV_CONFIG = {"map_size": 12, "max_cycles": 30}
# On this map red's attack 15 reaches blue's front once both have made two moves; blue stays.
MOVES = {"red": (8, 15), "blue": (4, 1)}


class ChargePolicy(RandomPolicy):
    """Moves its side towards the other for two rounds, then attacks (red) or stands (blue):
    blue agents die mid-episode."""

    def compute_actions_from_input_dict(
        self, input_dict: Mapping[str, Any], explore: bool | None = None, timestep: int | None = None
    ) -> tuple:
        move, attack = MOVES[self.config["side"]]
        t = np.asarray(input_dict["t"])
        return np.where(t < 2, move, attack).astype(np.int64), [], {}


def _policies() -> dict:
    return {
        side: {"policy_class": "tests.test_envs_battle:ChargePolicy", "config": {"side": side}}
        for side in MOVES
    }


def _battle_config(env_name: str, **overrides: Any):
    return config(env_name, policies=_policies(), policy_mapping_fn={"red_*": "red", "blue_*": "blue"},
                  num_envs=2, rollout_fragment_length=10, env_config=dict(ENV_CONFIG), seed=1,
                  **overrides)


def test_agents_die_mid_episode_and_every_reward_reaches_its_trajectory() -> None:
    tracker = EpisodeTracker()
    runner = EnvRunner(_battle_config(logged_env_name(BATTLE)), callbacks=tracker)
    with runner:
        batches = [runner.sample() for _ in range(7)]  # 70 rounds: two whole episodes a sub-env
        for batch in batches:
            check_batch_invariants(batch, rollout_fragment_length=10, num_fragments=2)
        whole = concat_samples(batches)
        assert_rewards_conserved(whole, runner, tracker, min_episodes=2)
    died = 0
    for policy_batch in whole.policy_batches.values():
        # Terminated before the time limit (the last round truncates everyone).
        died += int(np.count_nonzero(policy_batch["terminateds"] & (policy_batch["env_t"] < 29)))
    assert died > 0


def test_subprocess_sub_envs_give_the_batches_sync_ones_give() -> None:
    batches = {}
    for vectorize in ("sync", "subprocess"):
        extra = {"num_workers": 2} if vectorize == "subprocess" else {}
        with EnvRunner(_battle_config(BATTLE, vectorize=vectorize, **extra)) as runner:
            batches[vectorize] = [runner.sample() for _ in range(4)]
    for sync, sub in zip(batches["sync"], batches["subprocess"]):
        assert sync.policy_batches.keys() == sub.policy_batches.keys()
        for pid, expected in sync.policy_batches.items():
            got = sub.policy_batches[pid]
            assert list(got) == list(expected)
            for name in expected:
                if name == "eps_id":  # random per runner; the same episodes by position
                    continue
                if expected[name].dtype == object:
                    assert got[name].tolist() == expected[name].tolist(), name
                else:
                    np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{pid} {name}")
