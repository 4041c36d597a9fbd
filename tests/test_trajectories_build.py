"""Building transitions from stored rows: against a per-row reference, and on a real env."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from marl_runner import EnvRunner
from marl_runner.checks import trajectory_rows
from marl_runner.sampling.column_block import allocate_columns, take_rows
from marl_runner.sampling.rewards import RewardLedger
from marl_runner.sampling.trajectories import KeyTable, PolicyTrajectories
from tests.runner_helpers import config

AGENT_IDS = ["player_0", 7, "a_much_longer_agent_name", ("red", 3)]  # any hashable id


def _episode(env_id: int) -> SimpleNamespace:
    return SimpleNamespace(
        env_id=env_id, episode_id=1000 + env_id, start_step=0, rewards=RewardLedger(),
        training_enabled=True,
    )


def _store(seed: int) -> tuple[PolicyTrajectories, KeyTable, dict[int, list[dict]]]:
    """Rounds of rows from 3 sub-envs x 4 agents, agents ending (done) at random rounds and
    new episodes taking their place; rows appended in a shuffled order each round."""
    rng = np.random.default_rng(seed)
    table = KeyTable(capacity=4)  # grows while the rows are written
    store = PolicyTrajectories("p")
    live = {}  # (env, agent index) -> key
    rows_of: dict[int, list[dict]] = {}
    for round_index in range(12):
        chunk: dict[str, list] = {name: [] for name in ("keys", "t", "obs", "rewards", "terminateds",
                                                        "truncateds", "infos", "actions", "env_state")}
        slots = [(env, index) for env in range(3) for index in range(4)]
        rng.shuffle(slots)
        for env, index in slots:
            if (env, index) not in live:
                live[env, index] = table.allocate(_episode(env), index, AGENT_IDS[index])
            key = live[env, index]
            done = bool(rng.random() < 0.15)
            terminated = done and bool(rng.random() < 0.5)
            row = {
                "keys": key, "t": int(table.take_t(np.array([key]))[0]),
                "obs": rng.random(3).astype(np.float32), "rewards": np.float32(rng.random()),
                "terminateds": terminated, "truncateds": done and not terminated,
                "infos": {"round": round_index}, "actions": int(rng.integers(5)),
                "env_state": ("state", round_index, env),
            }
            rows_of.setdefault(key, []).append(row)
            for name, value in row.items():
                chunk[name].append(value)
            if done:
                del live[env, index]
        arrays = {name: _column(values) for name, values in chunk.items()}
        arrays["policy_version"] = np.int64(3)  # a 0-d column: the same on every row
        store.add(arrays, len(slots))
    return store, table, rows_of


def _column(values: list) -> np.ndarray:
    if isinstance(values[0], (dict, tuple)):
        column = np.empty(len(values), object)
        column[:] = values
        return column
    return np.array(values)


def _expected(table: KeyTable, rows_of: dict[int, list[dict]], built: list[int]) -> dict[str, list]:
    """The batch a per-row loop gives: keys in order, each row paired with the next."""
    out: dict[str, list] = {}
    for key in sorted(built):
        rows = rows_of[key]
        for opening, closing in zip(rows, rows[1:]):
            values = {
                "t": opening["t"], "obs": opening["obs"], "new_obs": closing["obs"],
                "rewards": closing["rewards"], "terminateds": closing["terminateds"],
                "truncateds": closing["truncateds"], "infos": closing["infos"],
                "actions": opening["actions"], "env_state": opening["env_state"],
                "new_env_state": closing["env_state"], "policy_version": 3,
                "eps_id": table.eps_id[key], "env_id": table.env_id[key],
                "agent_index": table.agent_index[key], "agent_id": str(table.agent_id[key]),
                "unroll_id": 5,
            }
            for name, value in values.items():
                out.setdefault(name, []).append(value)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("partial", [False, True])
def test_build_matches_a_per_row_pairing_of_every_column(seed: int, partial: bool) -> None:
    store, table, rows_of = _store(seed)
    built = [key for key in rows_of if not partial or table.env_id[key] != 1]
    mask = table.mask(built)
    stored_before = store.size
    batch, finished, segments = store.build(mask, table, unroll_id=5)

    expected = _expected(table, rows_of, built)
    assert list(batch) == [
        "t", "obs", "new_obs", "rewards", "terminateds", "truncateds", "infos", "actions",
        "env_state", "new_env_state", "policy_version", "eps_id", "env_id", "agent_index",
        "agent_id", "unroll_id", "continues",
    ]
    assert not batch["continues"].any()  # no fragment of these keys was built before
    # Rows come in the order their opening rows were stored; in key order (stable) they
    # are the per-row reference's.
    by_key = batch.select(segments.order)
    for name, values in expected.items():
        column = by_key[name]
        if column.dtype == object:
            assert column.tolist() == values, name
        else:
            np.testing.assert_array_equal(column, np.array(values, column.dtype), err_msg=name)
    assert batch["agent_id"].dtype == np.array([str(a) for a in AGENT_IDS]).dtype

    ends_done = {k for k in built if rows_of[k][-1]["terminateds"] or rows_of[k][-1]["truncateds"]}
    assert sorted(finished.tolist()) == sorted(ends_done)
    with_transitions = sorted(k for k in built if len(rows_of[k]) > 1)
    table_ = segments.table
    np.testing.assert_array_equal(table_[:, 0], with_transitions)
    np.testing.assert_array_equal(table_[:, 2] - table_[:, 1], [len(rows_of[k]) - 1 for k in with_transitions])
    # The unfinished built keys keep their last row; keys not built keep all of theirs.
    kept = len(built) - len(ends_done) + sum(len(rows_of[k]) for k in rows_of if k not in built)
    assert store.size == kept < stored_before


def test_a_build_with_no_selected_rows_keeps_everything() -> None:
    store, table, rows_of = _store(0)
    size = store.size
    batch, finished, segments = store.build(table.mask([]), table, unroll_id=1)
    assert batch is None and not len(finished) and segments.table.shape == (0, 3)
    assert store.size == size


def _lockstep_store(rounds: int, table: KeyTable, store: PolicyTrajectories, keys: list[int], start: int) -> None:
    """``rounds`` rounds of every key's row, obs = round number (keys never done)."""
    for round_index in range(start, start + rounds):
        n = len(keys)
        store.add({
            "keys": np.array(keys), "t": table.take_t(np.array(keys)),
            "obs": np.full((n, 4), round_index, np.float32), "rewards": np.ones(n, np.float32),
            "terminateds": np.zeros(n, bool), "truncateds": np.zeros(n, bool),
            "infos": np.fromiter([{}] * n, object, n),
        }, n)


def test_a_whole_build_hands_out_the_stored_rows_and_later_reuses_them() -> None:
    """Every key built at once: the opening rows are the first ones stored, so the batch's
    obs is a view of the store's array (no copy); once the batch is dropped, the next
    fragment's rows go into that same memory."""
    table, store = KeyTable(), PolicyTrajectories("p")
    keys = [table.allocate(_episode(0), i, f"a{i}") for i in range(3)]
    _lockstep_store(5, table, store, keys, 0)
    stored_obs = store.rows.view()["obs"]
    batch, _, _ = store.build(table.mask(keys), table, unroll_id=1)
    assert np.shares_memory(batch["obs"], stored_obs) and len(batch) == 12
    assert not np.shares_memory(batch["new_obs"], stored_obs)
    np.testing.assert_array_equal(batch["obs"][:, 0], np.repeat([0, 1, 2, 3], 3))
    np.testing.assert_array_equal(batch["new_obs"][:, 0], np.repeat([1, 2, 3, 4], 3))
    first_address = batch["obs"].__array_interface__["data"][0]
    del batch, stored_obs
    _lockstep_store(4, table, store, keys, 5)
    assert store.rows.view()["obs"].__array_interface__["data"][0] == first_address
    second, _, _ = store.build(table.mask(keys), table, unroll_id=2)
    # The kept last rows (round 4) open the second fragment's first transitions.
    np.testing.assert_array_equal(second["obs"][:, 0], np.repeat([4, 5, 6, 7], 3))
    np.testing.assert_array_equal(second["t"], np.repeat([4, 5, 6, 7], 3))
    assert second["continues"].tolist() == [True] * 3 + [False] * 9


def test_a_batch_still_held_is_never_written_over() -> None:
    table, store = KeyTable(), PolicyTrajectories("p")
    keys = [table.allocate(_episode(0), i, f"a{i}") for i in range(2)]
    _lockstep_store(3, table, store, keys, 0)
    first, _, _ = store.build(table.mask(keys), table, unroll_id=1)
    kept = first["obs"].copy()
    _lockstep_store(3, table, store, keys, 3)
    second, _, _ = store.build(table.mask(keys), table, unroll_id=2)
    np.testing.assert_array_equal(first["obs"], kept)
    assert not np.shares_memory(first["obs"], second["obs"])


def test_columns_left_out_are_not_built() -> None:
    table = KeyTable()
    store = PolicyTrajectories("p", exclude=frozenset({"new_obs", "infos"}))
    keys = [table.allocate(_episode(0), i, f"a{i}") for i in range(2)]
    _lockstep_store(3, table, store, keys, 0)
    batch, _, _ = store.build(table.mask(keys), table, unroll_id=1)
    assert "new_obs" not in batch and "infos" not in batch and len(batch) == 4
    assert {"obs", "rewards", "t", "eps_id"} <= set(batch)


def test_allocate_columns_keeps_order_aligns_and_leaves_object_columns_out() -> None:
    layout = {
        "flags": (np.dtype(bool), ()),
        "obs": (np.dtype(np.float64), (3, 2)),
        "infos": (np.dtype(object), ()),
        "names": (np.dtype("<U5"), ()),
    }
    columns = allocate_columns(layout, 7)
    assert list(columns) == list(layout) and columns["infos"] is None
    assert columns["obs"].shape == (7, 3, 2) and columns["obs"].dtype == np.float64
    assert columns["names"].shape == (7,) and columns["flags"].shape == (7,)
    assert all(c.flags.aligned for c in columns.values() if c is not None)
    columns["flags"][:] = False
    columns["names"][:] = ""
    columns["obs"][:] = 1.0
    assert not columns["flags"].any() and not any(columns["names"])  # no column overlaps another
    with pytest.raises(ValueError, match="num_rows must be >= 0, got -1"):
        allocate_columns(layout, -1)


def test_take_rows_into_out_or_a_new_array() -> None:
    column = np.arange(12).reshape(6, 2)
    out = np.empty((3, 2), column.dtype)
    assert take_rows(column, np.array([5, 0, 2]), out) is out
    np.testing.assert_array_equal(out, [[10, 11], [0, 1], [4, 5]])
    np.testing.assert_array_equal(take_rows(column, np.array([1]), None), [[2, 3]])


def test_real_env_batches_pair_new_obs_with_the_next_obs() -> None:
    cfg = config("pettingzoo.classic.connect_four_v3:env", num_envs=3, rollout_fragment_length=15,
                 policies={"shared": {"model": {"type": "mlp", "hidden": [8]}}}, seed=3)
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_env_steps=60).policy_batches["shared"]
    paired = 0
    for rows in trajectory_rows(batch).values():
        same_unroll = batch["unroll_id"][rows][1:] == batch["unroll_id"][rows][:-1]
        paired += int(same_unroll.sum())
        np.testing.assert_array_equal(batch["new_obs"][rows][:-1][same_unroll], batch["obs"][rows][1:][same_unroll])
        np.testing.assert_array_equal(batch["t"][rows][1:], batch["t"][rows][:-1] + 1)
    assert paired > 0
    assert batch["agent_id"].tolist() == [f"player_{i}" for i in batch["agent_index"]]


@pytest.mark.parametrize("done", [False, True])
@pytest.mark.parametrize("length", [1, 3, 5])
def test_a_column_of_another_length_than_the_rounds_rows_is_named(done: bool, length: int) -> None:
    """A custom policy's output or connector column with a row too few or too many (or one
    that would broadcast) is refused by name, in rounds with and without ending rows (those
    are gathered row by row, where a short column would otherwise repeat its last row)."""
    store = PolicyTrajectories("p")
    chunk = {
        "keys": np.arange(4), "t": np.zeros(4, np.int64), "obs": np.zeros((4, 2), np.float32),
        "terminateds": np.array([False, False, False, done]), "truncateds": np.zeros(4, bool),
        "vf_preds": np.zeros(length, np.float32), "policy_version": np.int64(0),
    }
    with pytest.raises(ValueError, match=rf"policy 'p': column 'vf_preds' has {length} rows .*\(4\)"):
        store.add(chunk, 4)
    assert store.size == 0


def test_a_build_holds_little_beyond_the_batch_it_makes() -> None:
    """The build is where a run holds the most memory: its row-sized index arrays must not
    all be alive when the batch's columns are made (about one such array is, at the peak)."""
    num_agents, num_rounds = 512, 101
    table = KeyTable(capacity=num_agents)
    keys = np.array([table.allocate(_episode(0), index, f"a{index}") for index in range(num_agents)])
    store = PolicyTrajectories("p")
    rng = np.random.default_rng(0)
    for _ in range(num_rounds):
        store.add({
            "keys": keys, "t": table.take_t(keys), "obs": rng.random((num_agents, 16), np.float32),
            "rewards": np.zeros(num_agents, np.float32), "terminateds": np.zeros(num_agents, bool),
            "truncateds": np.zeros(num_agents, bool), "actions": np.zeros(num_agents, np.int64),
        }, num_agents)
    tracemalloc.start()
    try:
        batch, _, segments = store.build(np.ones(table.capacity, bool), table, 0)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    num_rows = len(batch["obs"])
    assert num_rows == num_agents * (num_rounds - 1)
    assert (peak - held) / (8 * num_rows) < 2.5
    assert segments.batch_keys.dtype == np.uint16  # held until post-processing is done
