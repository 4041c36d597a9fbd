"""Trainer helpers on SampleBatch: minibatches, split_by_episode, to_tensors, TensorDict bridge."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from helpers_batches import CONNECT_FOUR, KAZ, assert_values_equal, sample

from marl_runner.batch import MultiAgentBatch, SampleBatch, concat_samples


@pytest.fixture(scope="module")
def kaz_archers() -> SampleBatch:
    (batch,), _ = sample(KAZ)
    return batch.policy_batches["archer"]


@pytest.fixture(scope="module")
def connect_four() -> SampleBatch:
    (batch,), _ = sample(CONNECT_FOUR)
    return batch.policy_batches["player_0"]


def dict_obs_batch(rows: int = 5) -> SampleBatch:
    infos = np.empty(rows, dtype=object)
    infos[:] = [{"i": i} for i in range(rows)]
    return SampleBatch(
        obs={
            "observation": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
            "action_mask": np.ones((rows, 2), np.int8),
        },
        actions=np.arange(rows),
        eps_id=np.array([3, 3, 1, 1, 3])[:rows],
        agent_id=np.array([f"a{i}" for i in range(rows)]),
        infos=infos,
    )


def numbered(batch: SampleBatch) -> SampleBatch:
    """The batch with a ``row`` column: each row's position, to find it again."""
    return SampleBatch(batch, row=np.arange(len(batch)))


def test_minibatches_cover_every_row_once(kaz_archers: SampleBatch) -> None:
    batch = numbered(kaz_archers)
    n = len(batch)
    parts = list(batch.minibatches(64, seed=1))
    assert [len(p) for p in parts] == [64] * (n // 64) + ([n % 64] if n % 64 else [])
    seen = np.concatenate([p["row"] for p in parts])
    assert sorted(seen.tolist()) == list(range(n))
    assert seen.tolist() != list(range(n))  # shuffled


def test_minibatches_seed_repeats_and_rows_stay_together(kaz_archers: SampleBatch) -> None:
    batch = numbered(kaz_archers)
    first = [p["row"] for p in batch.minibatches(50, seed=7)]
    again = [p["row"] for p in batch.minibatches(50, seed=7)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    other = [p["row"] for p in batch.minibatches(50, seed=8)]
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))
    for part in batch.minibatches(50, seed=7):
        for name in ("obs", "actions", "action_logp", "new_obs", "rewards"):
            np.testing.assert_array_equal(batch[name][part["row"]], part[name], err_msg=name)


def test_minibatches_without_shuffle_are_views_in_order() -> None:
    batch = dict_obs_batch()
    parts = list(batch.minibatches(2, shuffle=False))
    assert [len(p) for p in parts] == [2, 2, 1]  # the last one holds the remainder
    assert np.shares_memory(parts[1]["obs"]["observation"], batch["obs"]["observation"])
    np.testing.assert_array_equal(parts[2]["actions"], [4])
    assert parts[2]["infos"][0] == {"i": 4}


@pytest.mark.parametrize("size", [0, -3, 2.5, True, None])
def test_minibatch_size_must_be_a_positive_int(size: object) -> None:
    with pytest.raises(ValueError, match=f"size must be an int >= 1, got {size!r}"):
        next(dict_obs_batch().minibatches(size))  # type: ignore[arg-type]


def test_dict_columns_count_rows_and_select() -> None:
    """Regression: len() counted a Dict column's keys, select() failed on it."""
    batch = SampleBatch(obs={"a": np.zeros((5, 2)), "b": np.zeros(5)}, actions=np.arange(5))
    assert len(batch) == 5
    picked = batch.select(np.array([4, 0]))
    np.testing.assert_array_equal(picked["actions"], [4, 0])
    assert picked["obs"]["a"].shape == (2, 2)
    both = concat_samples([picked, batch.rows_slice(1, 2)])
    assert both["obs"]["b"].shape == (3,) and len(both) == 3


def test_split_by_episode_on_a_real_batch(kaz_archers: SampleBatch) -> None:
    episodes = kaz_archers.split_by_episode()
    ids = [int(e["eps_id"][0]) for e in episodes]
    assert len(set(ids)) == len(ids) == len(np.unique(kaz_archers["eps_id"]))
    assert all((e["eps_id"] == e["eps_id"][0]).all() for e in episodes)
    assert sum(len(e) for e in episodes) == len(kaz_archers)
    first_rows = [int(np.flatnonzero(kaz_archers["eps_id"] == i)[0]) for i in ids]
    assert first_rows == sorted(first_rows)  # in order of first appearance
    rows = np.flatnonzero(kaz_archers["eps_id"] == ids[0])
    np.testing.assert_array_equal(episodes[0]["obs"], kaz_archers["obs"][rows])


def test_in_trajectory_order_makes_each_trajectory_contiguous(kaz_archers: SampleBatch) -> None:
    rows = numbered(kaz_archers)
    ordered = rows.in_trajectory_order()
    assert sorted(ordered["row"].tolist()) == list(range(len(rows)))  # every row, once
    assert (np.diff(ordered["row"]) < 0).any()  # the runner's order interleaves trajectories
    ids = np.stack([ordered["eps_id"], ordered["agent_index"]], axis=1)
    starts = np.flatnonzero(np.any(ids[1:] != ids[:-1], axis=1)) + 1
    runs = np.split(np.arange(len(ordered)), starts)
    assert len(runs) == len({tuple(pair) for pair in ids.tolist()})  # one run per trajectory
    for run in runs:
        assert (np.diff(ordered["t"][run]) == 1).all()
        np.testing.assert_array_equal(ordered["new_obs"][run][:-1], ordered["obs"][run][1:])
    with pytest.raises(KeyError, match="'agent_index'"):
        SampleBatch(eps_id=np.zeros(2), t=np.zeros(2)).in_trajectory_order()


def test_split_by_episode_keeps_dict_columns_and_names_a_missing_column() -> None:
    first, second = dict_obs_batch().split_by_episode()
    np.testing.assert_array_equal(first["actions"], [0, 1, 4])
    np.testing.assert_array_equal(second["obs"]["observation"][:, 0], [6, 9])
    with pytest.raises(KeyError, match="no 'eps_id' column"):
        SampleBatch(obs=np.zeros(2)).split_by_episode()


def test_to_tensors_skips_infos_and_strings(connect_four: SampleBatch) -> None:
    tensors = connect_four.to_tensors("cpu")
    assert "infos" not in tensors and "agent_id" not in tensors  # agent ids are strings
    for name, column in connect_four.items():
        if name not in ("infos", "agent_id"):
            assert tensors[name].dtype == torch.from_numpy(np.asarray(column[:1])).dtype, name
            np.testing.assert_array_equal(tensors[name].numpy(), column)
    assert tensors["action_mask"].dtype == torch.int8
    nested = dict_obs_batch().to_tensors()
    assert set(nested) == {"obs", "actions", "eps_id"}
    assert nested["obs"]["action_mask"].dtype == torch.int8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_to_tensors_on_cuda(kaz_archers: SampleBatch) -> None:
    tensors = kaz_archers.to_tensors("cuda")
    assert tensors["obs"].device.type == "cuda"
    assert torch.equal(tensors["obs"].cpu(), torch.from_numpy(kaz_archers["obs"]))


def test_tensordict_round_trip_keeps_numeric_columns_and_dtypes(connect_four: SampleBatch) -> None:
    pytest.importorskip("tensordict", reason="the torchrl extra is not installed")
    td = connect_four.to_tensordict()
    assert td.batch_size == torch.Size([len(connect_four)])
    back = SampleBatch.from_tensordict(td)
    numeric = [name for name in connect_four if name not in ("infos", "agent_id")]
    assert sorted(back) == sorted(numeric)
    for name in numeric:
        assert_values_equal(connect_four[name], back[name], name)
    nested = SampleBatch.from_tensordict(dict_obs_batch().to_tensordict())
    assert_values_equal(dict_obs_batch()["obs"], nested["obs"], "obs")


def test_torchrl_replay_buffer_takes_a_batch(kaz_archers: SampleBatch) -> None:
    pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    batch = numbered(kaz_archers)
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=32)
    buffer.extend(batch.to_tensordict())
    assert len(buffer) == len(batch)
    drawn = SampleBatch.from_tensordict(buffer.sample())
    assert len(drawn) == 32
    for name in ("obs", "actions", "action_logp", "terminateds"):
        assert_values_equal(batch[name][drawn["row"]], drawn[name], name)


def test_tensordict_refuses_tuples_and_other_types() -> None:
    pytest.importorskip("tensordict", reason="the torchrl extra is not installed")
    batch = SampleBatch(pair=(np.zeros(2), np.ones(2)))
    with pytest.raises(TypeError, match="column 'pair' is a Tuple column"):
        batch.to_tensordict()
    with pytest.raises(TypeError, match="expects a TensorDict with one batch dimension, got dict"):
        SampleBatch.from_tensordict({"obs": torch.zeros(2)})


def test_missing_tensordict_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensordict", None)
    with pytest.raises(ImportError, match=r"pip install 'marl-runner\[torchrl\]'"):
        dict_obs_batch().to_tensordict()
    with pytest.raises(ImportError, match=r"from_tensordict needs tensordict"):
        SampleBatch.from_tensordict(object())


def test_multi_agent_batches_concat_with_dict_columns() -> None:
    one = MultiAgentBatch({"p": dict_obs_batch()}, env_steps=5)
    both = concat_samples([one, one])
    assert len(both.policy_batches["p"]) == 10
    assert both.policy_batches["p"]["obs"]["observation"].shape == (10, 3)


def test_to_torch_keeps_string_columns() -> None:
    """Regression: a str column (agent ids) made to_torch raise."""
    out = dict_obs_batch().to_torch()
    assert out["agent_id"].tolist() == ["a0", "a1", "a2", "a3", "a4"]
    assert out["actions"].dtype == torch.int64
