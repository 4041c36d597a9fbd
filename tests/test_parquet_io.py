"""write_batch(format="parquet"): episode-table schema, exact round trips, atomic files, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")

from helpers_batches import (  # noqa: E402
    CONNECT_FOUR,
    CONNECT_FOUR_DICT_OBS,
    KAZ,
    assert_batches_equal,
    sample,
)
from test_io import make_batch  # noqa: E402

import marl_runner  # noqa: E402
from marl_runner.batch import MultiAgentBatch, SampleBatch  # noqa: E402
from marl_runner.checks import check_batch_invariants  # noqa: E402
from marl_runner.config import space_from_spec  # noqa: E402
from marl_runner.io import list_batch_files, read_batch, read_batches, write_batch  # noqa: E402

CONFIGS = {"kaz": KAZ, "connect_four": CONNECT_FOUR, "connect_four_dict_obs": CONNECT_FOUR_DICT_OBS}


@pytest.fixture(scope="module")
def sampled() -> dict[str, tuple[list[MultiAgentBatch], dict]]:
    return {name: sample(config, batches=2) for name, config in CONFIGS.items()}


def policy_files(out: Path, pid: str) -> list[Path]:
    return sorted((out / pid).glob("*.parquet"))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_real_batches_read_back_equal_to_npz_and_to_what_was_written(
    tmp_path: Path, sampled: dict, name: str
) -> None:
    batches, metadata = sampled[name]
    for index, batch in enumerate(batches, start=1):
        write_batch(batch, tmp_path / "npz", index)
        write_batch(batch, tmp_path / "pq", index, "parquet", metadata=metadata)
    from_npz = list(read_batches(tmp_path / "npz"))
    from_parquet = list(read_batches(tmp_path / "pq"))
    assert len(from_parquet) == len(batches) == 2
    for original, a, b in zip(batches, from_npz, from_parquet):
        assert_batches_equal(original, b)
        assert_batches_equal(a, b)


def test_synthetic_columns_round_trip(tmp_path: Path) -> None:
    """Images (uint8), strings, nested and Tuple columns, state columns, JSON infos."""
    batch = make_batch()
    archer = batch.policy_batches["archer"]
    archer["pair"] = (np.arange(3, dtype=np.int16), {"x": np.ones((3, 2), np.float16)})
    write_batch(batch, tmp_path, 1, "parquet")
    write_batch(batch, tmp_path / "npz", 1)
    (loaded,) = read_batches(tmp_path)
    assert_batches_equal(read_batch(tmp_path / "npz" / "batch_000001.npz"), loaded)
    schema = pq.read_schema(tmp_path / "archer" / "batch_000001.parquet")
    assert schema.field("pixels").type == pa.list_(pa.list_(pa.list_(pa.uint8(), 3), 4), 4)
    assert schema.field("names").type == pa.string()
    assert schema.field("pair").type.field("1").type == pa.struct(
        [("x", pa.list_(pa.float16(), 2))]
    )


def test_kaz_schema_names_types_and_metadata(tmp_path: Path, sampled: dict) -> None:
    (batch, _), metadata = sampled["kaz"]
    write_batch(batch, tmp_path, 1, "parquet", metadata=metadata)
    table = pq.read_table(tmp_path / "archer" / "batch_000001.parquet")
    assert table.column_names[:16] == [
        "eps_id", "agent_id", "policy_id", "env_index", "env_t", "agent_t",
        "obs", "new_obs", "actions", "rewards", "terminated", "truncated",
        "action_logp", "vf_preds", "policy_version", "action_dist_inputs",
    ]  # fmt: skip
    assert table.column_names[-1] == "infos"
    schema = table.schema
    assert schema.field("obs").type == pa.list_(pa.float32(), 135)
    assert schema.field("terminated").type == pa.bool_()
    assert schema.field("infos").type == pa.string()
    assert schema.field("agent_id").type == pa.string()
    assert schema.field("env_t").type == pa.int64()
    assert schema.field("policy_version").type == pa.int64()
    assert set(table.column("policy_id").to_pylist()) == {"archer"}
    archer = batch.policy_batches["archer"]
    assert table.column("agent_t").to_pylist() == archer["t"].tolist()
    assert table.column("env_index").to_pylist() == archer["env_id"].tolist()
    assert table.column("agent_id").to_pylist() == archer["agent_id"].tolist()
    assert table.column("env_t").to_pylist() == archer["env_t"].tolist()

    meta = schema.metadata
    assert meta[b"marl_runner.format"] == b"marl-runner-parquet/1"
    assert meta[b"marl_runner.version"] == marl_runner.__version__.encode()
    assert meta[b"marl_runner.policy_id"] == b"archer"
    assert json.loads(meta[b"marl_runner.env"])["name"] == KAZ["env"]["name"]
    spaces = json.loads(meta[b"marl_runner.spaces"])
    assert set(spaces) == {"archer", "knight"}
    obs_space = space_from_spec(spaces["archer"]["observation_space"])
    assert obs_space.shape == (135,) and obs_space.dtype == np.float32
    position = json.loads(meta[b"marl_runner.batch"])
    assert position == {"index": 1, "part": 0, "parts": 1, "env_steps": batch.env_steps()}


@pytest.mark.parametrize("name", ["kaz", "connect_four"])
def test_agent_id_and_env_t_are_recorded_and_consistent(
    tmp_path: Path, sampled: dict, name: str
) -> None:
    """agent_id names the agent behind agent_index; env_t is the episode's env step at the
    row's obs: +1 per row in a parallel env where every agent acts each step (KAZ), and in a
    turn-based game each env step has exactly one acting agent (Connect Four)."""
    pd = pytest.importorskip("pandas")
    batches, metadata = sampled[name]
    for index, batch in enumerate(batches, start=1):
        check_batch_invariants(batch, t_from_zero=False)
        write_batch(batch, tmp_path, index, "parquet", metadata=metadata)
    rows = pd.concat(
        [pd.read_parquet(tmp_path / pid) for pid in batches[0].policy_batches], ignore_index=True
    )
    assert rows["agent_id"].notna().all() and rows["env_t"].notna().all()
    # One agent id per (episode, agent_index), and the policy the mapping gives it.
    assert (rows.groupby(["eps_id", "agent_index"])["agent_id"].nunique() == 1).all()
    assert (rows.groupby(["eps_id", "agent_id"])["agent_index"].nunique() == 1).all()
    assert all(a.startswith(p) for a, p in zip(rows["agent_id"], rows["policy_id"]))
    for (_, _), trajectory in rows.groupby(["eps_id", "agent_id"]):
        trajectory = trajectory.sort_values("agent_t")
        steps = np.diff(trajectory["env_t"].to_numpy())
        assert (steps == (1 if name == "kaz" else 2)).all(), steps
    if name == "kaz":
        assert (rows["env_t"] == rows["agent_t"]).all()  # every agent obs every step from reset
    else:
        first_episode = rows[rows["eps_id"] == rows["eps_id"].iloc[0]]
        acting = np.sort(first_episode["env_t"].to_numpy())
        assert acting.tolist() == list(range(len(acting)))


def test_dict_obs_is_a_struct_with_the_action_mask(tmp_path: Path, sampled: dict) -> None:
    (batch, _), metadata = sampled["connect_four_dict_obs"]
    write_batch(batch, tmp_path, 1, "parquet", metadata=metadata)
    schema = pq.read_schema(tmp_path / "player_0" / "batch_000001.parquet")
    board = pa.list_(pa.list_(pa.list_(pa.int8(), 2), 7), 6)
    expected = pa.struct([("observation", board), ("action_mask", pa.list_(pa.int8(), 7))])
    assert schema.field("obs").type == expected
    assert schema.field("new_obs").type == expected
    rows = pq.read_table(tmp_path / "player_0").column("obs").to_pylist()
    first = batch.policy_batches["player_0"]["obs"][0]
    assert rows[0]["action_mask"] == first["action_mask"].tolist()
    assert rows[0]["observation"] == first["observation"].tolist()


def test_default_chain_keeps_the_action_mask_column(tmp_path: Path, sampled: dict) -> None:
    (batch, _), _ = sampled["connect_four"]
    write_batch(batch, tmp_path, 1, "parquet")
    schema = pq.read_schema(tmp_path / "player_1" / "batch_000001.parquet")
    assert schema.field("action_mask").type == pa.list_(pa.int8(), 7)
    assert schema.field("obs").type == pa.list_(pa.float32(), 84)


def test_rows_per_file_cap_splits_a_policy_into_parts(tmp_path: Path, sampled: dict) -> None:
    (batch, _), _ = sampled["kaz"]
    rows = len(batch.policy_batches["archer"])
    manifest = write_batch(batch, tmp_path, 3, "parquet", max_rows_per_file=25)
    files = policy_files(tmp_path, "archer")
    assert len(files) == -(-rows // 25)
    assert files[0].name == "batch_000003.parquet" and files[1].name == "batch_000003_001.parquet"
    assert [pq.read_metadata(f).num_rows for f in files][:-1] == [25] * (len(files) - 1)
    assert pq.read_table(tmp_path / "archer").num_rows == rows
    assert json.loads(manifest.read_text())["files"]["archer"][0] == "archer/batch_000003.parquet"
    assert_batches_equal(batch, read_batch(manifest))


def test_zstd_by_default_and_compression_choice(tmp_path: Path, sampled: dict) -> None:
    (batch, _), _ = sampled["kaz"]
    write_batch(batch, tmp_path / "z", 1, "parquet")
    write_batch(batch, tmp_path / "s", 1, "parquet", compression="snappy")
    for sub, codec in (("z", "ZSTD"), ("s", "SNAPPY")):
        meta = pq.read_metadata(tmp_path / sub / "knight" / "batch_000001.parquet")
        assert meta.row_group(0).column(0).compression == codec


def test_batches_listed_in_index_order_by_manifest(tmp_path: Path) -> None:
    for index in (10, 2):
        write_batch(make_batch(env_steps=index), tmp_path, index, "parquet")
    assert [p.name for p in list_batch_files(tmp_path)] == [
        "batch_000002.json",
        "batch_000010.json",
    ]
    assert [b.env_steps() for b in read_batches(tmp_path)] == [2, 10]


def test_batch_without_manifest_is_not_listed(tmp_path: Path) -> None:
    """Data files appear first, the manifest last: a reader never sees part of a batch."""
    write_batch(make_batch(), tmp_path, 1, "parquet")
    write_batch(make_batch(), tmp_path, 2, "parquet")
    (tmp_path / "batch_000002.json").unlink()
    (tmp_path / ".batch_000003.abc.tmp").write_bytes(b"PAR1")
    assert [p.name for p in list_batch_files(tmp_path)] == ["batch_000001.json"]


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = pq.write_table
    calls = []

    def write_then_fail(table: object, where: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_batch(make_batch(), tmp_path, 1, "parquet")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_existing_batch_is_not_overwritten(tmp_path: Path) -> None:
    write_batch(make_batch(), tmp_path, 1, "parquet")
    with pytest.raises(FileExistsError, match="batch_000001.json"):
        write_batch(make_batch(), tmp_path, 1, "parquet")


def test_empty_batch_and_empty_policy(tmp_path: Path) -> None:
    write_batch(MultiAgentBatch({}, env_steps=4), tmp_path, 1, "parquet")
    empty = SampleBatch(obs=np.zeros((0, 3), np.float32), actions=np.zeros(0, np.int64))
    write_batch(MultiAgentBatch({"p": empty}, env_steps=0), tmp_path, 2, "parquet")
    first, second = read_batches(tmp_path)
    assert first.policy_batches == {} and first.env_steps() == 4
    assert_batches_equal(MultiAgentBatch({"p": empty}, env_steps=0), second)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"format": "csv"}, ValueError, "format 'csv' is not one of"),
        (
            {"format": "parquet", "max_rows_per_file": 0},
            ValueError,
            "max_rows_per_file must be >= 1",
        ),
        ({"format": "parquet", "max_rows_per_file": 2.5}, TypeError, "must be an int, got 2.5"),
        ({"format": "parquet", "compression": "zip"}, ValueError, "compression 'zip' is not one"),
        ({"format": "parquet", "metadata": {"seed": 1}}, ValueError, "keys \\['env', 'spaces'\\]"),
        ({"metadata": {"env": {}}}, ValueError, "apply to format='parquet' only"),
        ({"max_rows_per_file": 5}, ValueError, "apply to format='parquet' only"),
    ],
)
def test_bad_arguments_are_named(
    tmp_path: Path, kwargs: dict, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        write_batch(make_batch(), tmp_path, 1, **kwargs)
    assert list_batch_files(tmp_path) == []


def test_policy_id_must_name_a_directory(tmp_path: Path) -> None:
    batch = MultiAgentBatch({"..": SampleBatch(obs=np.zeros(1))}, env_steps=1)
    with pytest.raises(ValueError, match=r"policy id '\.\.' cannot name a directory"):
        write_batch(batch, tmp_path, 1, "parquet")


def test_renamed_column_clash_is_named(tmp_path: Path) -> None:
    batch = SampleBatch(t=np.arange(2), agent_t=np.arange(2))
    with pytest.raises(
        ValueError, match="'agent_t' would be stored as 'agent_t', which column 't'"
    ):
        write_batch(MultiAgentBatch({"p": batch}, env_steps=2), tmp_path, 1, "parquet")
    batch = SampleBatch(policy_id=np.arange(2))
    with pytest.raises(ValueError, match="which the policy id already uses"):
        write_batch(MultiAgentBatch({"p": batch}, env_steps=2), tmp_path, 1, "parquet")


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    manifest = write_batch(make_batch(), tmp_path, 1, "parquet")
    (tmp_path / "knight" / "batch_000001.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"batch_000001\.json is not a readable marl-runner batch"):
        read_batch(manifest)
    manifest.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="unsupported format 'other'"):
        list(read_batches(tmp_path))


def test_missing_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.delitem(sys.modules, "marl_runner.io.parquet", raising=False)
    monkeypatch.delattr(marl_runner.io, "parquet", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'marl-runner\[parquet\]'"):
        write_batch(make_batch(), tmp_path, 1, "parquet")


def test_columns_read_back_are_writable_like_the_ones_written(tmp_path: Path) -> None:
    """Arrow's buffers are read-only; trainers write columns in place (and torch warns)."""
    write_batch(make_batch(), tmp_path, 1, "parquet")
    (batch,) = read_batches(tmp_path)
    for policy_batch in batch.policy_batches.values():
        for name, column in policy_batch.items():
            if isinstance(column, np.ndarray) and column.dtype != object:
                assert column.flags.writeable, name
