"""write_batch / read_batches: round trips, file naming, atomic writes, files anyone can read."""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.io import batch_path, list_batch_files, read_batch, read_batches, write_batch


def make_batch(seed: int = 0, env_steps: int = 5) -> MultiAgentBatch:
    rng = np.random.default_rng(seed)
    infos = np.empty(3, dtype=object)
    infos[:] = [{"hit": True}, {}, {"pos": np.arange(3), "tag": ("a", 1)}]
    archer = SampleBatch(
        obs=rng.random((3, 27, 5)).astype(np.float32),
        new_obs=rng.random((3, 27, 5)).astype(np.float32),
        actions=np.array([0, 5, 2], np.int64),
        rewards=np.array([0.0, 1.0, -0.5], np.float32),
        terminateds=np.array([False, False, True]),
        truncateds=np.zeros(3, bool),
        infos=infos,
        eps_id=np.array([7, 7, 7], np.int64),
        t=np.arange(3),
        state_in_0=np.zeros((3, 16), np.float32),
        pixels=rng.integers(0, 255, (3, 4, 4, 3), dtype=np.uint8),
        names=np.array(["a", "bb", "ccc"]),
    )
    knight_infos = np.empty(2, dtype=object)
    knight_infos[:] = [{}, {"x": 1}]
    knight = SampleBatch(
        obs=rng.random((2, 4)),
        actions={"move": np.array([1, 2]), "attack": np.array([True, False])},  # nested column
        infos=knight_infos,
    )
    return MultiAgentBatch({"archer": archer, "knight": knight}, env_steps=env_steps)


def assert_same(a: MultiAgentBatch, b: MultiAgentBatch) -> None:
    assert a.env_steps() == b.env_steps()
    assert a.agent_steps() == b.agent_steps()
    assert list(a.policy_batches) == list(b.policy_batches)
    for pid, batch in a.policy_batches.items():
        other = b.policy_batches[pid]
        assert isinstance(other, SampleBatch)
        assert list(batch) == list(other)
        for name, column in batch.items():
            if isinstance(column, dict):
                assert column.keys() == other[name].keys()
                for k in column:
                    np.testing.assert_array_equal(column[k], other[name][k])
            elif column.dtype == object:
                assert other[name].dtype == object
                assert len(other[name]) == len(column)
                for x, y in zip(column, other[name]):
                    assert x.keys() == y.keys()
                    for k in x:
                        np.testing.assert_array_equal(x[k], y[k])
            else:
                assert other[name].dtype == column.dtype
                np.testing.assert_array_equal(other[name], column)


def test_round_trip_with_object_infos(tmp_path: Path) -> None:
    batch = make_batch()
    path = write_batch(batch, tmp_path / "out", 1)
    assert path == tmp_path / "out" / "batch_000001.npz"
    (loaded,) = list(read_batches(tmp_path / "out"))
    assert_same(batch, loaded)
    assert loaded.policy_batches["archer"]["infos"][2] == {"pos": [0, 1, 2], "tag": ["a", 1]}


def test_numeric_columns_load_without_pickle(tmp_path: Path) -> None:
    path = write_batch(make_batch(), tmp_path, 3)
    with np.load(path, allow_pickle=False) as data:
        assert "header" in data.files
        assert all(data[key].dtype != object for key in data.files)


def test_empty_batch(tmp_path: Path) -> None:
    write_batch(MultiAgentBatch({}, env_steps=0), tmp_path, 1)
    (loaded,) = read_batches(tmp_path)
    assert loaded.policy_batches == {} and loaded.env_steps() == 0


def test_batches_come_back_in_index_order(tmp_path: Path) -> None:
    for index in (10, 2, 1_000_000, 999_999):
        write_batch(make_batch(env_steps=index), tmp_path, index)
    assert [b.env_steps() for b in read_batches(tmp_path)] == [2, 10, 999_999, 1_000_000]
    assert [p.name for p in list_batch_files(tmp_path)][:2] == [
        "batch_000002.npz",
        "batch_000010.npz",
    ]


def test_temp_and_unrelated_files_are_ignored(tmp_path: Path) -> None:
    write_batch(make_batch(), tmp_path, 1)
    (tmp_path / ".batch_000002.abc123.tmp").write_bytes(b"PK\x03\x04 half a zip")
    (tmp_path / "batch_000003.npz.tmp").write_bytes(b"partial")
    (tmp_path / "config.yaml").write_text("env: {}\n")
    (tmp_path / "batch_x.npz").write_bytes(b"")
    (tmp_path / "batch_000004.npz").mkdir()
    assert [p.name for p in list_batch_files(tmp_path)] == ["batch_000001.npz"]
    assert len(list(read_batches(tmp_path))) == 1


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_batch(make_batch(), tmp_path, 1)
    assert list(tmp_path.iterdir()) == []


def test_write_interrupted_mid_file_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted_savez(file: object, **arrays: object) -> None:
        file.write(b"PK\x03\x04 partial")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted_savez)
    with pytest.raises(KeyboardInterrupt):
        write_batch(make_batch(), tmp_path, 1)
    assert list(tmp_path.iterdir()) == []


def test_visible_file_is_always_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the moment of the rename the temp file is already fully written and synced."""
    seen: list[tuple[str, int]] = []
    real_replace = os.replace

    def checking_replace(src: str, dst: str) -> None:
        assert not Path(dst).exists()
        assert Path(src).name.startswith(".batch_000001.") and Path(src).parent == tmp_path
        seen.append((Path(src).name, len(list(read_batches(tmp_path)))))
        assert read_batch(src).env_steps() == 5  # complete before it becomes visible
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", checking_replace)
    write_batch(make_batch(), tmp_path, 1)
    assert seen and seen[0][1] == 0  # not listed while it was still a temp file
    assert [p.name for p in tmp_path.iterdir()] == ["batch_000001.npz"]


def test_existing_batch_is_not_overwritten(tmp_path: Path) -> None:
    write_batch(make_batch(), tmp_path, 1)
    with pytest.raises(FileExistsError, match="batch_000001.npz"):
        write_batch(make_batch(), tmp_path, 1)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="MultiAgentBatch"):
        write_batch(SampleBatch(obs=np.zeros(2)), tmp_path, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="index"):
        write_batch(make_batch(), tmp_path, -1)
    with pytest.raises(TypeError, match="policy ids must be strings"):
        write_batch(MultiAgentBatch({1: SampleBatch(obs=np.zeros(2))}, 1), tmp_path, 1)  # type: ignore[dict-item]
    with pytest.raises(FileNotFoundError):
        list(read_batches(tmp_path / "missing"))


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    path = batch_path(tmp_path, 1)
    path.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"batch_000001\.npz is not a readable marl-runner batch"):
        list(read_batches(tmp_path))
    np.savez(path.with_name("other.npz"), x=np.zeros(2))
    path.with_name("other.npz").replace(path)
    with pytest.raises(ValueError, match="not a readable"):
        read_batch(path)


def test_plain_numpy_reads_real_column_names(tmp_path: Path) -> None:
    """Regression (issue 8, redesign 9): entries were c0, c1 ... and infos were pickled."""
    batch = make_batch()
    path = write_batch(batch, tmp_path, 1)
    with np.load(path, allow_pickle=False) as data:
        np.testing.assert_array_equal(data["archer/obs"], batch.policy_batches["archer"]["obs"])
        np.testing.assert_array_equal(data["archer/names"], ["a", "bb", "ccc"])
        np.testing.assert_array_equal(data["knight/actions/move"], [1, 2])
        assert [json.loads(text) for text in data["archer/infos"]] == [
            {"hit": True},
            {},
            {"pos": [0, 1, 2], "tag": ["a", 1]},
        ]
        assert not any(name.startswith("c") and name[1:].isdigit() for name in data.files)


def test_dict_and_tuple_obs_flatten_to_named_entries(tmp_path: Path) -> None:
    obs = {
        "observation": np.ones((2, 3), np.float32),
        "action_mask": np.array([[1, 0], [0, 1]], np.int8),
    }
    batch = MultiAgentBatch(
        {"p": SampleBatch(obs=obs, pair=(np.arange(2), {"x": np.zeros(2)}))}, env_steps=2
    )
    path = write_batch(batch, tmp_path, 1)
    with np.load(path, allow_pickle=False) as data:
        assert {"p/obs/observation", "p/obs/action_mask", "p/pair/0", "p/pair/1/x"} <= set(
            data.files
        )
    loaded = read_batch(path).policy_batches["p"]
    assert loaded["obs"].keys() == obs.keys()
    np.testing.assert_array_equal(loaded["obs"]["action_mask"], obs["action_mask"])
    assert isinstance(loaded["pair"], tuple)
    np.testing.assert_array_equal(loaded["pair"][1]["x"], np.zeros(2))


def test_reading_never_unpickles(tmp_path: Path) -> None:
    """A file holding a pickled object array (e.g. the old format) is refused, not unpickled."""
    path = batch_path(tmp_path, 1)
    header = {
        "format": "marl-runner-batch",
        "version": 2,
        "env_steps": 1,
        "agent_steps": 1,
        "policies": [{"id": "p", "columns": [{"name": "infos", "encoding": "array"}]}],
    }
    infos = np.empty(1, dtype=object)
    infos[0] = {"evil": True}
    np.savez(
        path,
        header=np.frombuffer(json.dumps(header).encode(), np.uint8),
        **{"p/infos": infos},
    )
    with pytest.raises(ValueError, match="not a readable marl-runner batch"):
        read_batch(path)


def test_files_are_readable_by_everyone(tmp_path: Path) -> None:
    path = write_batch(make_batch(), tmp_path, 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert zipfile.is_zipfile(path)


def test_dict_obs_rows_come_back_as_dicts_of_arrays(tmp_path: Path) -> None:
    """Regression: an object column of Dict obs rows came back as JSON lists (int8 lost)."""
    obs = np.empty(2, dtype=object)
    obs[:] = [
        {"observation": np.full((2, 3), i, np.int8), "action_mask": np.array([1, i], np.int8)}
        for i in range(2)
    ]
    batch = MultiAgentBatch({"p": SampleBatch(obs=obs, actions=np.arange(2))}, env_steps=2)
    path = write_batch(batch, tmp_path, 1)
    with np.load(path, allow_pickle=False) as data:
        assert data["p/obs/action_mask"].shape == (2, 2)
    loaded = read_batch(path).policy_batches["p"]["obs"]
    assert loaded.dtype == object and list(loaded[1]) == ["observation", "action_mask"]
    assert loaded[1]["observation"].dtype == np.int8
    np.testing.assert_array_equal(loaded[1]["action_mask"], [1, 1])
