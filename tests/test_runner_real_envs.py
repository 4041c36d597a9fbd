"""The runner on real PettingZoo envs: batch invariants, reward conservation, action masks."""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner import EnvRunner, check_batch_invariants
from marl_runner.envs import register_env
from tests.envs import PadSpacesWrapper
from tests.runner_helpers import EpisodeTracker, RewardLogging, assert_rewards_conserved, config

KAZ = "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"
SPREAD = "mpe2.simple_spread_v3:parallel_env"
TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"
CONNECT_FOUR = "pettingzoo.classic.connect_four_v3:env"
TWO_SEATS = {
    "player_0": {"model": {"type": "mlp", "hidden": [16]}},
    "player_1": {"model": {"type": "mlp", "hidden": [16]}},
    "player_2": {"model": {"type": "mlp", "hidden": [16]}},
}


def _logged(name: str) -> str:
    from tests.runner_helpers import logged_env_name

    return logged_env_name(name)


CASES = {
    "kaz": dict(
        env_name=KAZ,
        env_config={"obs_method": "vector", "max_cycles": 40},
        policies={"archer": {"model": {"type": "mlp", "hidden": [16]}}, "knight": {}},
        policy_mapping_fn={"archer_*": "archer", "knight_*": "knight"},
        steps=160,
    ),
    "spread": dict(env_name=SPREAD, env_config={"max_cycles": 25}, steps=120),
    "tictactoe": dict(
        env_name=TICTACTOE, policies=TWO_SEATS, policy_mapping_fn="examples.mappings:by_seat",
        steps=120,
    ),
    "connect_four": dict(
        env_name=CONNECT_FOUR, policies=TWO_SEATS, policy_mapping_fn="examples.mappings:by_seat",
        steps=160,
    ),
}


def _runner(case: str, **overrides) -> tuple[EnvRunner, EpisodeTracker]:
    spec = {**CASES[case], **overrides}
    spec.pop("steps")
    name = _logged(spec.pop("env_name"))
    tracker = EpisodeTracker()
    return EnvRunner(config(name, **spec), callbacks=tracker), tracker


@pytest.mark.parametrize("case", sorted(CASES))
def test_truncated_fragments_keep_every_invariant(case: str) -> None:
    runner, tracker = _runner(case, rollout_fragment_length=20)
    with runner:
        batch = runner.sample(num_env_steps=CASES[case]["steps"])
        check_batch_invariants(batch, rollout_fragment_length=20)
        assert batch.env_steps() == CASES[case]["steps"]
        assert_rewards_conserved(batch, runner, tracker)


@pytest.mark.parametrize("case", sorted(CASES))
def test_complete_episodes_conserve_every_reward(case: str) -> None:
    runner, tracker = _runner(case, batch_mode="complete_episodes")
    with runner:
        batch = runner.sample(num_episodes=4)
        check_batch_invariants(batch)
        checked = assert_rewards_conserved(batch, runner, tracker, min_episodes=4)
        metrics = runner.get_metrics()
    assert metrics["episodes"] >= checked
    for policy_batch in batch.policy_batches.values():
        done = policy_batch["terminateds"] | policy_batch["truncateds"]
        # Every trajectory in a complete episode ends with exactly one done row.
        assert done.sum() == len({tuple(k) for k in zip(policy_batch["eps_id"], policy_batch["agent_index"])})


@pytest.mark.parametrize("case", ["tictactoe", "connect_four"])
def test_masked_actions_are_never_chosen_in_board_games(case: str) -> None:
    runner, _ = _runner(case)
    with runner:
        batch = runner.sample(num_env_steps=300)
        metrics = runner.get_metrics()
    for policy_batch in batch.policy_batches.values():
        masks, actions = policy_batch["action_mask"], policy_batch["actions"]
        assert masks[np.arange(len(actions)), actions].all()
    # An illegal move ends a board game with a -1 for the mover: none may happen.
    assert metrics["episodes"] > 0


def test_kaz_agents_die_and_their_trajectories_end_there() -> None:
    runner, tracker = _runner("kaz", rollout_fragment_length=50,
                              env_config={"obs_method": "vector", "max_cycles": 200})
    with runner:
        batch = runner.sample(num_env_steps=800)
    check_batch_invariants(batch, rollout_fragment_length=50)
    archers = batch.policy_batches["archer"]
    # Agents die before the time limit: some trajectories end terminated early.
    early = archers["terminateds"] & (archers["t"] < 199)
    assert early.any()


def _generated_env(cfg: dict) -> RewardLogging:
    from pettingzoo.test.example_envs import generated_agents_env_action_mask_info_v0

    from marl_runner.envs import AECPettingZooEnv

    return RewardLogging(PadSpacesWrapper(AECPettingZooEnv(generated_agents_env_action_mask_info_v0.env())))


def _generated_parallel_env(cfg: dict) -> RewardLogging:
    from pettingzoo.test.example_envs import generated_agents_parallel_v0

    from marl_runner.envs import ParallelPettingZooEnv

    return RewardLogging(PadSpacesWrapper(ParallelPettingZooEnv(generated_agents_parallel_v0.parallel_env())))


register_env("test_generated_mask_info", _generated_env)
register_env("test_generated_parallel", _generated_parallel_env)


@pytest.mark.slow  # (4-7 s of long episodes; MaskInfoEnv covers info masks by default)
def test_generated_agents_with_info_masks_spawn_die_and_never_pick_masked_actions() -> None:
    tracker = EpisodeTracker()
    # PettingZoo's generated env now and then selects a dead agent again, which breaks the
    # AEC contract: that episode is dropped as faulty, so restarts must be on.
    cfg = config("test_generated_mask_info", batch_mode="complete_episodes", num_envs=2,
                 restart_failed_sub_environments=True)
    with EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_episodes=2)
        check_batch_invariants(batch)
        assert_rewards_conserved(batch, runner, tracker, min_episodes=2)
    shared = batch.policy_batches["shared"]
    assert shared["action_mask"][np.arange(len(shared)), shared["actions"]].all()
    assert len(np.unique(shared["agent_index"])) > 5  # agents spawned beyond the initial five


def test_generated_parallel_agents_spawn_mid_episode() -> None:
    tracker = EpisodeTracker()
    cfg = config("test_generated_parallel", num_envs=2, rollout_fragment_length=50)
    with EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_env_steps=200)
    check_batch_invariants(batch, rollout_fragment_length=50, t_from_zero=False)
    shared = batch.policy_batches["shared"]
    first_t = {}
    for eps, index, t in zip(shared["eps_id"], shared["agent_index"], shared["t"]):
        first_t.setdefault((eps, index), t)
    # Spawned agents start their own trajectory at t == 0 in a later fragment too.
    assert all(t == 0 for t in first_t.values())


def test_same_seed_gives_identical_batches() -> None:
    def run() -> dict:
        runner, _ = _runner("kaz", seed=7)
        with runner:
            return runner.sample(num_env_steps=60).policy_batches

    first, second = run(), run()
    for policy_id, batch in first.items():
        for column in ("obs", "new_obs", "actions", "rewards", "terminateds", "t"):
            np.testing.assert_array_equal(batch[column], second[policy_id][column])
        # episode ids are random per runner (unique across processes): the same rows share one
        np.testing.assert_array_equal(
            np.unique(batch["eps_id"], return_inverse=True)[1],
            np.unique(second[policy_id]["eps_id"], return_inverse=True)[1],
        )
