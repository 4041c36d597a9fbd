"""Every batch of a long truncate_episodes run passes the checks with no flags: the batch
says which trajectories continue an earlier fragment (``continues``); a gap, a wrong start
and a missing first row are still caught; a missing column is named."""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner import BatchInvariantError, EnvRunner, SampleBatch, check_batch_invariants
from marl_runner.checks import trajectory_rows
from tests.runner_helpers import config

MLP = {"model": {"type": "mlp", "hidden": [8]}}
ENVS = {
    "kaz": ("pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env", {"obs_method": "vector"}),
    "connect_four": ("pettingzoo.classic.connect_four_v3:env", {}),
    "battle": ("magent2.environments.battle_v4:parallel_env", {"map_size": 16, "max_cycles": 30}),
}


def _batches(env: str, count: int, **overrides) -> list:
    name, env_config = ENVS[env]
    cfg = config(name, num_envs=2, rollout_fragment_length=13, env_config=env_config,
                 policies={"shared": MLP}, seed=4, **overrides)
    with EnvRunner(cfg) as runner:
        return [runner.sample() for _ in range(count)]


@pytest.mark.parametrize("env", sorted(ENVS))
def test_every_batch_of_a_long_run_passes_with_no_flags(env: str) -> None:
    batches = _batches(env, 5)
    continued = 0
    for batch in batches:
        check_batch_invariants(batch, rollout_fragment_length=13, num_fragments=2)
        for policy_batch in batch.policy_batches.values():
            continues = policy_batch["continues"]
            starts = [rows[0] for rows in trajectory_rows(policy_batch).values()]
            # t == 0 exactly where the batch says an episode starts.
            np.testing.assert_array_equal(policy_batch["t"][starts] == 0, ~continues[starts])
            continued += int(continues.sum())
    assert continued > 0  # fragments cut episodes: later batches go on with them


def _continuing_batch() -> SampleBatch:
    """A policy batch of a later fragment in which some trajectories (of 3 rows or more)
    continue and others start."""
    for batch in _batches("connect_four", 8)[1:]:
        policy_batch = batch.policy_batches["shared"]
        if _rows_of_a(policy_batch, True) is not None and _rows_of_a(policy_batch, False) is not None:
            return policy_batch
    raise AssertionError("no batch with both kinds of trajectory")


def _rows_of_a(policy_batch: SampleBatch, continuing: bool) -> np.ndarray | None:
    for rows in trajectory_rows(policy_batch).values():
        if bool(policy_batch["continues"][rows[0]]) == continuing and len(rows) > 2:
            return rows
    return None


def test_a_gap_inside_a_trajectory_is_caught() -> None:
    batch = _continuing_batch()
    rows = _rows_of_a(batch, continuing=True)
    kept = np.setdiff1d(np.arange(len(batch)), rows[1:2])
    with pytest.raises(BatchInvariantError, match="t is not consecutive"):
        check_batch_invariants(batch.select(kept))


def test_a_missing_first_row_of_an_episode_is_caught() -> None:
    batch = _continuing_batch()
    rows = _rows_of_a(batch, continuing=False)
    kept = np.setdiff1d(np.arange(len(batch)), rows[:1])
    with pytest.raises(BatchInvariantError, match=r"t starts at 1, expected 0 \(the batch says"):
        check_batch_invariants(batch.select(kept))


def test_a_wrong_start_is_caught_both_ways() -> None:
    batch = _continuing_batch()
    starting, continuing = _rows_of_a(batch, False), _rows_of_a(batch, True)
    flipped = batch.select(np.arange(len(batch)))
    flipped["continues"][starting[0]] = True
    with pytest.raises(BatchInvariantError, match="t starts at 0, but the batch says it continues"):
        check_batch_invariants(flipped)
    flipped = batch.select(np.arange(len(batch)))
    flipped["continues"][continuing[0]] = False
    with pytest.raises(BatchInvariantError, match="expected 0"):
        check_batch_invariants(flipped)


def test_a_missing_column_is_named() -> None:
    batch = _continuing_batch()
    del batch["eps_id"]
    with pytest.raises(BatchInvariantError, match="missing column 'eps_id'"):
        check_batch_invariants(batch)


def test_excluded_columns_are_left_out_and_the_rest_still_checks() -> None:
    full = _batches("connect_four", 2)
    lean = _batches("connect_four", 2, exclude_columns=["new_obs", "infos"])
    for whole, without in zip(full, lean):
        check_batch_invariants(without)
        for pid, policy_batch in without.policy_batches.items():
            assert "new_obs" not in policy_batch and "infos" not in policy_batch
            reference = whole.policy_batches[pid]
            assert set(reference) - set(policy_batch) == {"new_obs", "infos"}
            for name in set(policy_batch) - {"eps_id"}:  # same seeds: the same rows (ids are random)
                np.testing.assert_array_equal(policy_batch[name], reference[name], err_msg=name)


def test_a_policy_with_gae_still_bootstraps_from_new_obs_it_does_not_hand_out() -> None:
    gae = {"model": {"type": "mlp", "hidden": [8]}, "config": {"gae": {"gamma": 0.9, "lambda": 0.95}}}
    name, env_config = ENVS["kaz"]
    batches = {}
    for excluded in ([], ["new_obs"]):
        cfg = config(name, num_envs=2, rollout_fragment_length=13, env_config=env_config,
                     policies={"shared": gae}, seed=4, exclude_columns=excluded)
        with EnvRunner(cfg) as runner:
            batches[bool(excluded)] = runner.sample().policy_batches["shared"]
    assert "new_obs" not in batches[True] and "new_obs" in batches[False]
    np.testing.assert_allclose(batches[True]["advantages"], batches[False]["advantages"], rtol=1e-6)
