"""Dictionary-encoded Parquet columns: their decoded size is held to the read bound before
they are decoded, and the writer's own files (dictionary-encoded by default) still read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_bounded_batch_files import PEAK_MIB, read_in_child

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.io import read_batch, write_batch

pa = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")


def written(out: Path, batch: SampleBatch) -> tuple[Path, Path]:
    """(manifest, data file) of ``batch`` written as policy "p"'s batch 1."""
    manifest = write_batch(MultiAgentBatch({"p": batch}, env_steps=len(batch)), out, 1, "parquet")
    return manifest, out / "p" / "batch_000001.parquet"


def small_batch(rows: int) -> SampleBatch:
    infos = np.empty(rows, dtype=object)
    infos[:] = [{"k": 1}] * rows
    return SampleBatch(obs=np.zeros((rows, 2), np.float32), eps_id=np.arange(rows), infos=infos)


def test_a_dictionary_encoded_string_bomb_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    """One 1 MiB string on 160 rows, dictionary-encoded: a 6 KB file declaring 1 MB
    uncompressed passed the declared-size check and was decoded (160 MiB, twice) first."""
    manifest, data_file = written(tmp_path, small_batch(160))
    table = pq.read_table(data_file)
    column = table.schema.get_field_index("infos")
    bomb = pa.array(["x" * (1 << 20)] * 160, pa.string())
    table = table.set_column(column, table.schema.field(column), bomb)
    pq.write_table(table, data_file, compression="zstd", dictionary_pagesize_limit=2 << 20)
    del table, bomb
    assert data_file.stat().st_size < 20_000
    assert "RLE_DICTIONARY" in pq.ParquetFile(data_file).metadata.row_group(0).column(3).encodings
    out, peak = read_in_child(manifest)
    assert out.startswith("REFUSED") and str(data_file) in out
    assert "column 'infos' would decode to 167,77" in out
    assert peak < PEAK_MIB


def test_an_encoding_that_does_not_bound_its_decoded_size_is_refused(tmp_path: Path) -> None:
    manifest, data_file = written(tmp_path, small_batch(4))
    table = pq.read_table(data_file)
    pq.write_table(
        table, data_file, use_dictionary=False, column_encoding={"infos": "DELTA_BYTE_ARRAY"}
    )
    with pytest.raises(ValueError, match=rf"{data_file}: column 'infos' uses .*DELTA_BYTE_ARRAY"):
        read_batch(manifest)


def test_the_writers_dictionary_encoded_strings_read_back_exactly(tmp_path: Path) -> None:
    """Top-level, nested and fixed-shape string columns, and infos repeated on every row:
    what read_dictionary must decode back after the size check."""
    rows = 300
    infos = np.empty(rows, dtype=object)
    infos[:] = [{"note": "n" * 2000, "i": i % 3} for i in range(rows)]
    batch = SampleBatch(
        obs={
            "pos": np.arange(rows * 2, dtype=np.float32).reshape(rows, 2),
            "tag": np.array([f"t{i % 4}" for i in range(rows)]),
        },
        names=np.array([["a", "bb"], ["ccc", ""]] * (rows // 2)),
        raw=np.array([b"\x01\xff", b"z"] * (rows // 2)),
        eps_id=np.zeros(rows, np.int64),
        infos=infos,
    )
    manifest, data_file = written(tmp_path, batch)
    encodings = [
        pq.ParquetFile(data_file).metadata.row_group(0).column(i).encodings for i in range(6)
    ]
    assert all("RLE_DICTIONARY" in used for used in encodings)
    loaded = read_batch(manifest).policy_batches["p"]
    assert list(loaded) == list(batch)
    np.testing.assert_array_equal(loaded["obs"]["tag"], batch["obs"]["tag"])
    np.testing.assert_array_equal(loaded["obs"]["pos"], batch["obs"]["pos"])
    for name in ("names", "raw", "eps_id"):
        assert loaded[name].dtype == batch[name].dtype
        np.testing.assert_array_equal(loaded[name], batch[name])
    assert json.dumps(list(loaded["infos"])) == json.dumps(list(batch["infos"]))


def test_fixed_width_columns_are_sized_from_the_row_count_before_any_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zeros dictionary-encoded declare a few bytes per row group whatever the row count:
    rows x width is what they decode to, checked before a page is read."""
    from marl_runner.io.parquet_bounds import read_bounded

    _, data_file = written(tmp_path, SampleBatch(eps_id=np.zeros(1000, np.int64)))

    def no_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("a column was decoded")

    with open(data_file, "rb") as file:
        parquet_file = pq.ParquetFile(file)
        monkeypatch.setattr(pq.ParquetFile, "read", no_read)
        with pytest.raises(ValueError, match=r"column 'eps_id' would decode to 8,000 bytes"):
            read_bounded(parquet_file, file, ["eps_id"], data_file, limit=7999)


def test_strings_and_bytes_with_nul_characters_read_back_whole(tmp_path: Path) -> None:
    """pyarrow cut numpy str / bytes values at their first NUL: b"\\x00\\xff" came back b""."""
    names = np.array(["a\x00b", "\x00x", "plain"])
    raw = np.array([b"\x00\xff", b"a\x00b", b"z"])
    manifest, _ = written(tmp_path, SampleBatch(names=names, raw=raw, pair=np.stack([raw, raw], 1)))
    loaded = read_batch(manifest).policy_batches["p"]
    for name, column in (("names", names), ("raw", raw), ("pair", np.stack([raw, raw], 1))):
        assert loaded[name].dtype == column.dtype
        assert loaded[name].tolist() == column.tolist()
