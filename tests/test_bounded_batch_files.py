"""Hostile batch files: every header field, reference and size is checked before allocating.

Each file here is small on disk and was built to make a naive reader take
gigabytes, recurse without end or fail with a bare ``KeyError``. The readers
must refuse it with their own error (a ``ValueError`` naming the file and the
field) while the reading process stays within a small multiple of the bytes
on disk, which a child process under an address-space cap measures.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers_bounded import run_capped

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.io import read_batch, read_batches, write_batch

CAP_MIB = 1024  # the child's address space: a reader that follows the file's word fails
PEAK_MIB = 250  # what a bounded read of these small files may reach (imports included)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def header_entry(header: object) -> bytes:
    text = header if isinstance(header, str) else json.dumps(header)
    return npy_bytes(np.frombuffer(text.encode(), np.uint8))


def write_npz(path: Path, entries: dict[str, bytes], compressed: set[str] = frozenset()) -> Path:
    """A zip of ``.npy`` entries, some deflated: what np.savez(_compressed) writes, by hand."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            kind = zipfile.ZIP_DEFLATED if name in compressed else zipfile.ZIP_STORED
            archive.writestr(f"{name}.npy", data, compress_type=kind, compresslevel=1)
    return path


def batch_header(columns: list[dict], **changes: object) -> dict:
    return {
        "format": "marl-runner-batch",
        "version": 2,
        "env_steps": 1,
        "agent_steps": 1,
        "policies": [{"id": "p", "columns": columns}],
        **changes,
    }


def read_in_child(path: Path) -> tuple[str, float]:
    """``read_batch(path)`` in a capped child: (what it printed, its peak RSS in MiB)."""
    result = run_capped(
        f"""
        from marl_runner.io import read_batch
        try:
            read_batch({str(path)!r})
            print("READ")
        except ValueError as exc:
            print("REFUSED", exc)
        """,
        cap_mib=CAP_MIB,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.peak_rss_mib is not None
    return result.stdout, result.peak_rss_mib


def test_one_entry_referenced_many_times_is_refused(tmp_path):
    """Case 1: 100 fields naming one 4 MB entry would be 400 MB from a 4 MB file."""
    structure = {f"k{i}": "p/obs/big" for i in range(100)}
    columns = [{"name": "obs", "encoding": "nested", "structure": structure}]
    big = npy_bytes(np.zeros(4 << 20, np.uint8))
    path = write_npz(
        tmp_path / "batch_000001.npz",
        {"header": header_entry(batch_header(columns)), "p/obs/big": big},
    )
    out, peak = read_in_child(path)
    assert out.startswith("REFUSED") and str(path) in out
    assert "'p/obs/big'" in out and "structure.k0" in out and "structure.k1" in out
    assert "once" in out
    assert peak < PEAK_MIB


def test_a_compressed_entry_is_refused_before_it_is_inflated(tmp_path):
    """Cases 1 and 2: 10 MB of zeros deflate to ~10 KB; 30 of them would be 300 MB."""
    entries = {
        "header": header_entry(
            batch_header([{"name": f"c{i}", "encoding": "array"} for i in range(30)])
        )
    }
    zeros = npy_bytes(np.zeros(10 << 20, np.uint8))
    entries.update((f"p/c{i}", zeros) for i in range(30))
    path = write_npz(tmp_path / "batch_000001.npz", entries, compressed=set(entries) - {"header"})
    assert path.stat().st_size < 2 << 20
    out, peak = read_in_child(path)
    assert out.startswith("REFUSED") and str(path) in out and "p/c0" in out
    assert "compressed" in out
    assert peak < PEAK_MIB


@pytest.mark.parametrize(
    ("shape", "shown"), [(b"(99999999,), }", "[99999999]"), (b"(-4, -4), }", "[-4, -4]")]
)
def test_a_declared_shape_other_than_its_bytes_is_refused(tmp_path, shape, shown):
    """(-4, -4) multiplies to the stored 16 values (the header's padding keeps its length):
    numpy's reader took it, and the reshape failed in a bare ValueError."""
    data = bytearray(npy_bytes(np.zeros(16, np.float32)))
    end = data.index(b"}") + 4
    data[:end] = data[:end].replace(b"(16,), }   ", shape)
    path = write_npz(
        tmp_path / "batch_000001.npz",
        {
            "header": header_entry(batch_header([{"name": "obs", "encoding": "array"}])),
            "p/obs": bytes(data),
        },
    )
    with pytest.raises(ValueError, match=rf"p/obs.*declares shape {re.escape(shown)}"):
        read_batch(path)


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ([1, 2], "a JSON list"),
        ({k: v for k, v in batch_header([]).items() if k != "env_steps"}, "'env_steps'"),
        (batch_header([], env_steps="5"), "'env_steps'"),
        (batch_header([{"name": "obs"}]), "encoding"),
        (batch_header([{"name": "obs", "encoding": "nested", "structure": 5}]), "structure"),
        (batch_header([], policies={"p": []}), "'policies'"),
        (batch_header([{"name": "obs", "encoding": "array"}]), "'p/obs'"),  # no such entry
    ],
)
def test_malformed_headers_are_the_readers_error_naming_file_and_field(tmp_path, header, field):
    """Case 3: deep nesting, wrong JSON types and missing fields: a ValueError, not a
    RecursionError, AttributeError or KeyError."""
    path = write_npz(tmp_path / "batch_000001.npz", {"header": header_entry(header)})
    with pytest.raises(ValueError) as info:
        read_batch(path)
    assert str(path) in str(info.value) and field in str(info.value)
    assert len(str(info.value)) < 400


def test_columns_with_the_wrong_dtype_are_refused(tmp_path):
    """Case 4: rewards stored as strings read back and passed the invariant checks."""
    batch = SampleBatch(
        rewards=np.array(["1.0", "bad"]),
        eps_id=np.array([1, 1]),
        t=np.array([0, 1]),
        terminateds=np.array([False, True]),
        truncateds=np.array([False, False]),
    )
    path = write_batch(MultiAgentBatch({"p": batch}, env_steps=2), tmp_path, 1)
    with pytest.raises(ValueError, match=r"p/rewards.*<U3.*number"):
        read_batch(path)
    flags = SampleBatch(terminateds=np.array([0.5, 1.0]))
    path = write_batch(MultiAgentBatch({"p": flags}, env_steps=2), tmp_path, 2)
    with pytest.raises(ValueError, match=r"p/terminateds.*bool"):
        read_batch(path)


def test_an_object_array_entry_is_refused_without_unpickling(tmp_path):
    header = batch_header([{"name": "obs", "encoding": "array"}])
    fake = bytearray(npy_bytes(np.zeros(4, np.int8)))
    fake[: fake.index(b"}") + 1] = fake[: fake.index(b"}") + 1].replace(b"'|i1'", b"'|O' ")
    path = write_npz(
        tmp_path / "batch_000001.npz", {"header": header_entry(header), "p/obs": bytes(fake)}
    )
    with pytest.raises(ValueError, match="p/obs"):
        read_batch(path)


def test_a_symlink_to_a_device_or_a_fifo_is_refused_without_blocking(tmp_path):
    link = tmp_path / "batch_000001.npz"
    link.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        read_batch(link)
    fifo = tmp_path / "fifo" / "batch_000001.npz"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"not a regular file \(a FIFO\)"):
        read_batch(fifo)
    assert list(read_batches(fifo.parent)) == []  # listed files are regular files only


# ---- Parquet


pyarrow = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
import pyarrow.parquet as pq  # noqa: E402


def small_parquet_batch(out: Path, rows: int = 10) -> Path:
    batch = SampleBatch(
        obs=np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
        rewards=np.ones(rows, np.float32),
        eps_id=np.zeros(rows, np.int64),
        names=np.array([f"a{i}" for i in range(rows)]),
    )
    return write_batch(MultiAgentBatch({"p": batch}, env_steps=rows), out, 1, format="parquet")


def rewrite_table(path: Path, change) -> None:
    table = pq.read_table(path)
    options = {"use_dictionary": False, "write_statistics": False, "data_page_size": 64 << 20}
    pq.write_table(change(table), path, compression="zstd", **options)  # fast for huge values


def set_record_dtype(data_file: Path, column: str, dtype: str) -> None:
    """Rewrites a Parquet data file with its column record for ``column`` saying ``dtype``."""

    def change(table):
        metadata = dict(table.schema.metadata)
        records = json.loads(metadata[b"marl_runner.columns"])
        for record in records:
            if record["name"] == column:
                record["dtype"] = dtype
        metadata[b"marl_runner.columns"] = json.dumps(records).encode()
        return table.replace_schema_metadata(metadata)

    rewrite_table(data_file, change)


def test_a_parquet_column_the_schema_does_not_name_is_not_read(tmp_path):
    """Case 2: a 200 MB zstd column of zeros not in the column records costs nothing (the
    issue's was 1 GB: a reader that reads it peaks past 300 MB here)."""
    manifest = small_parquet_batch(tmp_path)
    data_file = tmp_path / "p" / "batch_000001.parquet"
    zeros = bytes(20 << 20)

    def add_bomb(table):
        bomb = pyarrow.array([zeros] * table.num_rows, pyarrow.large_binary())
        return table.append_column("bomb", bomb).replace_schema_metadata(table.schema.metadata)

    rewrite_table(data_file, add_bomb)
    assert data_file.stat().st_size < 1 << 20
    out, peak = read_in_child(manifest)
    assert out == "READ"
    assert peak < 200


def test_a_manifest_may_not_list_a_file_twice(tmp_path):
    """Case 2: one file listed 40 times was read 40 times."""
    manifest = small_parquet_batch(tmp_path)
    content = json.loads(manifest.read_text())
    content["files"]["p"] = content["files"]["p"] * 40
    manifest.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=r"batch_000001.json.*'p/batch_000001.parquet'.*twice"):
        read_batch(manifest)


@pytest.mark.parametrize("name", ["../outside.parquet", "/etc/passwd", "q/batch_000001.parquet"])
def test_a_manifest_may_only_name_its_policys_files(tmp_path, name):
    manifest = small_parquet_batch(tmp_path)
    content = json.loads(manifest.read_text())
    content["files"]["p"] = [name]
    manifest.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=r"files.*p"):
        read_batch(manifest)


def test_a_string_column_record_wider_than_the_file_allows_is_refused(tmp_path):
    """Case 2: a record saying ``<U4000000`` made 100 rows take 1.6 GB."""
    manifest = small_parquet_batch(tmp_path, rows=100)
    data_file = tmp_path / "p" / "batch_000001.parquet"

    set_record_dtype(data_file, "names", "<U4000000")
    out, peak = read_in_child(manifest)
    assert out.startswith("REFUSED") and "<U4000000" in out and "names" in out
    assert str(data_file) in out
    assert peak < PEAK_MIB


@pytest.mark.parametrize("where", ["manifest", "columns"])
def test_deeply_nested_parquet_metadata_is_the_readers_error(tmp_path, where):
    """Case 3: a nested manifest or column record was a RecursionError."""
    manifest = small_parquet_batch(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    if where == "manifest":
        manifest.write_text(
            '{"format": "marl-runner-parquet", "version": 1, "files": ' + deep + "}"
        )
        culprit = manifest
    else:
        culprit = tmp_path / "p" / "batch_000001.parquet"

        def nest(table):
            metadata = {**table.schema.metadata, b"marl_runner.columns": deep.encode()}
            return table.replace_schema_metadata(metadata)

        rewrite_table(culprit, nest)
    with pytest.raises(ValueError) as info:
        read_batch(manifest)
    assert str(culprit) in str(info.value) and "nested" in str(info.value)


def test_parquet_columns_with_the_wrong_dtype_are_refused(tmp_path):
    manifest = small_parquet_batch(tmp_path)
    data_file = tmp_path / "p" / "batch_000001.parquet"

    set_record_dtype(data_file, "rewards", "<U8")
    with pytest.raises(ValueError, match=r"rewards.*<U8.*number"):
        read_batch(manifest)


@pytest.mark.parametrize("dtype", ["<U0", "U", "|S0", "S", "a", "8&4"])
def test_a_parquet_string_record_without_a_size_or_not_a_dtype_is_refused(tmp_path, dtype):
    """An unsized string dtype is sized by numpy to the longest value: one 20,000-character
    value among 30,000 empty ones made a 989-byte file take 2.4 GB. A text numpy cannot
    parse as a dtype (``8&4``) was numpy's own bare ValueError."""
    manifest = small_parquet_batch(tmp_path)
    data_file = tmp_path / "p" / "batch_000001.parquet"

    set_record_dtype(data_file, "names", dtype)
    with pytest.raises(ValueError, match=r"columns\[3\].dtype.* is .*expected a bool, number or sized str"):
        read_batch(manifest)


@pytest.mark.parametrize("column", ["rewards", "eps_id", "names", "obs", "obs_values"])
def test_parquet_nulls_are_refused_naming_the_column(tmp_path, column):
    """Another writer's missing values read as NaN, INT64_MIN, False or 0 before."""
    manifest = small_parquet_batch(tmp_path)
    data_file = tmp_path / "p" / "batch_000001.parquet"

    def with_a_null(table):
        name = "obs" if column == "obs_values" else column
        values = table.column(name).combine_chunks()
        if column == "obs_values":  # a list whose values hold a null
            flat = values.flatten().to_pylist()
            flat[4] = None
            nulled = pyarrow.FixedSizeListArray.from_arrays(pyarrow.array(flat, pyarrow.float32()), 3)
        else:
            rows = values.to_pylist()
            rows[1] = None
            nulled = pyarrow.array(rows, values.type)
        index = table.schema.get_field_index(name)
        return table.set_column(index, name, nulled).replace_schema_metadata(table.schema.metadata)

    rewrite_table(data_file, with_a_null)
    name = "obs" if column == "obs_values" else column
    with pytest.raises(ValueError, match=rf"column '{name}' holds 1 nulls .*expected a value in"):
        read_batch(manifest)


RAGGED = {
    "columns_of_two_lengths": (
        [{"name": "obs", "encoding": "array"}, {"name": "rewards", "encoding": "array"}],
        {"p/obs": np.zeros((8, 2), np.float32), "p/rewards": np.zeros(3, np.float32)},
        8,
    ),
    "a_zero_d_column": (
        [{"name": "rewards", "encoding": "array"}, {"name": "obs", "encoding": "array"}],
        {"p/rewards": np.ones((), np.float32), "p/obs": np.zeros((1, 2), np.float32)},
        1,
    ),
    "nested_parts_of_two_lengths": (
        [{"name": "actions", "encoding": "nested",
          "structure": {"__tuple__": ["p/actions/0", "p/actions/1"]}}],
        {"p/actions/0": np.zeros(4), "p/actions/1": np.zeros(1)},
        4,
    ),
}


@pytest.mark.parametrize("case", sorted(RAGGED))
def test_npz_columns_must_hold_one_number_of_rows(tmp_path, case):
    """A shorter column misaligned rows, or failed in minibatches() with a bare IndexError."""
    columns, arrays, rows = RAGGED[case]
    header = batch_header(columns, env_steps=rows, agent_steps=rows)
    entries = {"header": header_entry(header)}
    entries.update({name: npy_bytes(array) for name, array in arrays.items()})
    path = write_npz(tmp_path / "batch_000001.npz", entries)
    with pytest.raises(ValueError, match=r"policy 'p': its columns hold different numbers of rows"):
        read_batch(path)
