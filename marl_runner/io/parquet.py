"""Batches as Parquet episode tables: one directory per policy, one manifest per batch.

Layout of an output directory (``write_batch(..., format="parquet")``)::

    out/archer/batch_000001.parquet       # policy "archer"'s rows of batch 1
    out/archer/batch_000001_001.parquet   # more of them, past max_rows_per_file
    out/knight/batch_000001.parquet
    out/batch_000001.json                 # the manifest: written last

A policy's files share one schema (its spaces fix the column types), so
``pandas.read_parquet("out/archer")`` or DuckDB's ``'out/*/*.parquet'``
read a whole run. Every file is written atomically (temp file, fsync,
rename) and the manifest, which lists the batch's files, only after all of
them: ``read_batches`` lists a batch once its manifest exists, so it never
sees part of one. The columns and metadata are in docs/DATA.md.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from marl_runner.batch import MultiAgentBatch, SampleBatch, concat_samples
from marl_runner.config import ConfigError, space_to_spec
from marl_runner.io.atomic import fsync_directory, write_atomically
from marl_runner.io.batch_checks import BatchFileError, field, load_json, shortened
from marl_runner.io.parquet_bounds import leaf_count, read_bounded
from marl_runner.io.parquet_columns import batch_to_table, read_records, table_to_batch
from marl_runner.safe_files import FileRefused, open_regular_file

__all__ = [
    "DEFAULT_MAX_ROWS_PER_FILE",
    "manifest_path",
    "parquet_metadata",
    "read_parquet_batch",
    "write_parquet_batch",
]

FORMAT_NAME = "marl-runner-parquet"
FORMAT_VERSION = 1
DEFAULT_MAX_ROWS_PER_FILE = 100_000
MANIFEST_FILE = re.compile(r"batch_(\d+)\.json")
_POLICY_DIR = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_METADATA_KEYS = ("env", "spaces")
COMPRESSIONS = ("zstd", "snappy", "gzip", "brotli", "lz4", "none")
#: The marl-runner version that writes a file, recorded in its manifest and schema.
PROJECT_VERSION = version("marl-runner")
_MANIFEST_FIELDS = ("format", "version", "project_version", "env_steps", "agent_steps", "files")
#: A manifest lists file names: a few KB. Larger is not a manifest.
MAX_MANIFEST_BYTES = 1 << 20
#: Bytes a data file may decode to per byte on disk, plus a fixed allowance (max_read_bytes).
MAX_EXPANSION = 64
READ_ALLOWANCE = 64 << 20


def manifest_path(out_dir: str | Path, index: int) -> Path:
    """Where batch number ``index``'s manifest lives: ``out_dir/batch_000001.json``."""
    return Path(out_dir) / f"batch_{index:06d}.json"


def write_parquet_batch(
    batch: MultiAgentBatch,
    out_dir: Path,
    index: int,
    *,
    metadata: Mapping[str, Any] | None = None,
    max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE,
    compression: str = "zstd",
) -> Path:
    """Writes ``batch``'s policy tables, then its manifest; returns the manifest's path.

    ``metadata`` (``parquet_metadata(runner)``) adds the env and the policies'
    spaces to every file's schema metadata. Nothing is left behind when a
    write fails.
    """
    if isinstance(max_rows_per_file, bool) or not isinstance(max_rows_per_file, int):
        raise TypeError(f"write_batch: max_rows_per_file must be an int, got {max_rows_per_file!r}")
    if max_rows_per_file < 1:
        raise ValueError(f"write_batch: max_rows_per_file must be >= 1, got {max_rows_per_file}")
    if compression not in COMPRESSIONS:
        raise ValueError(
            f"write_batch: compression {compression!r} is not one of {list(COMPRESSIONS)}"
        )
    manifest = manifest_path(out_dir, index)
    if manifest.exists():
        raise FileExistsError(
            f"write_batch: {manifest} already exists; write to an empty directory"
        )
    shared = _shared_metadata(metadata)
    tables = {
        pid: _policy_tables(pid, sb, index, batch.env_steps(), max_rows_per_file, shared)
        for pid, sb in batch.policy_batches.items()
    }
    written: list[Path] = []
    try:
        files = {}
        for pid, parts in tables.items():
            (out_dir / pid).mkdir(exist_ok=True)
            files[pid] = []
            for part, table in enumerate(parts):
                name = f"{pid}/{_data_file_name(index, part)}"
                _write_table(out_dir / name, table, compression, written)
                files[pid].append(name)
            fsync_directory(out_dir / pid)
        content = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "project_version": PROJECT_VERSION,
            "env_steps": batch.env_steps(),
            "agent_steps": batch.agent_steps(),
            "files": files,
        }
        text = json.dumps(content, indent=1).encode("utf-8")
        write_atomically(manifest, lambda file: file.write(text))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    fsync_directory(out_dir)
    return manifest


def read_parquet_batch(manifest: Path) -> MultiAgentBatch:
    """Loads the batch a manifest names, with exactly the columns that were written.

    Manifest and data files may have been crafted and are checked before use:
    regular files only; the manifest at most ``MAX_MANIFEST_BYTES``, its JSON
    at most ``MAX_JSON_DEPTH`` deep, every field typed; it lists each file
    once, by the name the writer gives it in its policy's directory. Of a data
    file only the columns its column records name are read, after their
    declared uncompressed size is checked against ``max_read_bytes``, and
    every column must decode to no more than the same bound, checked before
    it is decoded (dictionary-encoded ones too: ``parquet_bounds``).
    """
    try:
        with open_regular_file(manifest, max_bytes=MAX_MANIFEST_BYTES) as file:
            content = load_json(file.read(MAX_MANIFEST_BYTES), manifest, "manifest")
    except FileRefused as exc:
        raise BatchFileError(manifest, f"it {exc}") from None
    except OSError as exc:
        raise BatchFileError(manifest, exc.strerror or str(exc)) from None
    if not isinstance(content, dict):
        raise BatchFileError(manifest, f"its manifest is {shortened(content)}; expected an object")
    if content.get("format") != FORMAT_NAME or content.get("version") != FORMAT_VERSION:
        raise BatchFileError(
            manifest,
            f"unsupported format {shortened(content.get('format'))} version "
            f"{shortened(content.get('version'))}; expected {FORMAT_NAME!r} version "
            f"{FORMAT_VERSION}",
        )
    unknown = sorted(set(content) - set(_MANIFEST_FIELDS))
    if unknown:
        raise BatchFileError(
            manifest,
            f"manifest has unknown fields {shortened(unknown)}; expected {list(_MANIFEST_FIELDS)}",
        )
    counts = {}
    for key in ("env_steps", "agent_steps"):
        counts[key] = field(content, key, int, manifest, key)
        if counts[key] < 0:
            raise BatchFileError(manifest, f"field {key!r} is {counts[key]}; expected >= 0")
    files = field(content, "files", dict, manifest, "files")
    policy_batches = {}
    for pid, names in files.items():
        parts = []
        for path in _data_files(manifest, pid, names):
            try:
                parts.append(_read_table(path))
            except BatchFileError as exc:  # named by the manifest the user asked for too
                raise BatchFileError(manifest, f"{path}: {exc.problem}") from None
        policy_batches[pid] = parts[0] if len(parts) == 1 else _concat(parts, manifest, pid)
    batch = MultiAgentBatch(policy_batches, env_steps=counts["env_steps"])
    if batch.agent_steps() != counts["agent_steps"]:
        raise BatchFileError(
            manifest,
            f"field 'agent_steps' is {counts['agent_steps']}, but its files hold "
            f"{batch.agent_steps()} rows",
        )
    return batch


def max_read_bytes(file_bytes: int) -> int:
    """What reading a data file of ``file_bytes`` may decode at most: ``MAX_EXPANSION`` times
    its size plus ``READ_ALLOWANCE`` (zstd packs repetitive columns well, zeros best)."""
    return MAX_EXPANSION * file_bytes + READ_ALLOWANCE


def _data_files(manifest: Path, pid: Any, names: Any) -> list[Path]:
    """The data files the manifest lists for ``pid``: each once, each the writer's name for
    a file of this batch in the policy's own directory."""
    where = f"files.{pid}"
    if not isinstance(pid, str) or not _POLICY_DIR.fullmatch(pid):
        raise BatchFileError(
            manifest,
            f"field 'files' has the policy id {shortened(pid)}, which names no policy directory",
        )
    if not isinstance(names, list) or not names:
        raise BatchFileError(
            manifest,
            f"field {where!r} is {shortened(names)}; expected a non-empty list of file names",
        )
    index = MANIFEST_FILE.fullmatch(manifest.name)
    stem = f"batch_{index.group(1)}" if index else r"batch_\d+"
    allowed = re.compile(rf"{re.escape(pid)}/{stem}(?:_\d{{3,}})?\.parquet")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not allowed.fullmatch(name):
            raise BatchFileError(
                manifest,
                f"field {where!r} lists {shortened(name)}; expected files named "
                f"'{pid}/{stem if index else 'batch_NNNNNN'}[_NNN].parquet'",
            )
        if name in seen:
            raise BatchFileError(
                manifest, f"field {where!r} lists {name!r} twice; expected each file once"
            )
        seen.add(name)
    return [manifest.parent / name for name in names]


def _concat(parts: list[SampleBatch], manifest: Path, pid: str) -> SampleBatch:
    try:
        return concat_samples(parts)
    except (KeyError, TypeError, ValueError) as exc:
        raise BatchFileError(
            manifest, f"the files of policy {pid!r} do not fit together: {exc}"
        ) from None


def parquet_metadata(source: Any) -> dict[str, Any]:
    """The env and every built policy's spaces of an ``EnvRunner`` (or an ``EnvRunnerGroup``'s
    first runner), for ``write_batch(..., format="parquet", metadata=...)``.

    Policies are built when their first agent appears, so ask after sampling.
    """
    if hasattr(source, "foreach_runner"):
        found = source.foreach_runner(parquet_metadata)
        if not found:
            raise RuntimeError("parquet_metadata: the runner group has no healthy runner")
        return found[0]
    return {
        "env": source.config.to_dict()["env"],
        "spaces": {
            pid: {"observation_space": _space_spec(obs), "action_space": _space_spec(act)}
            for pid, (obs, act) in source.policy_map.get_spaces().items()
        },
    }


def _shared_metadata(metadata: Mapping[str, Any] | None) -> dict[bytes, bytes]:
    """Schema metadata every file of the batch carries."""
    shared = {
        b"marl_runner.format": f"{FORMAT_NAME}/{FORMAT_VERSION}".encode(),
        b"marl_runner.version": PROJECT_VERSION.encode(),
    }
    if metadata is None:
        return shared
    if not isinstance(metadata, Mapping) or not set(metadata) <= set(_METADATA_KEYS):
        raise ValueError(
            f"write_batch: metadata must be a mapping with keys {list(_METADATA_KEYS)} "
            f"(see parquet_metadata), got {metadata!r}"
        )
    for key, value in metadata.items():
        try:
            shared[f"marl_runner.{key}".encode()] = json.dumps(value).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"write_batch: metadata[{key!r}] is not JSON-serialisable: {exc}"
            ) from None
    return shared


def _policy_tables(
    pid: Any,
    batch: SampleBatch,
    index: int,
    env_steps: int,
    max_rows: int,
    shared: dict[bytes, bytes],
) -> list[pa.Table]:
    """One table per file: the policy's rows cut at ``max_rows`` (one file when empty)."""
    if not isinstance(pid, str) or not _POLICY_DIR.fullmatch(pid):
        raise ValueError(
            f"write_batch: policy id {pid!r} cannot name a directory; expected letters, digits, "
            f"'_', '-' and '.', not starting with '.'"
        )
    starts = range(0, max(len(batch), 1), max_rows)
    tables = []
    for part, start in enumerate(starts):
        table = batch_to_table(batch.rows_slice(start, start + max_rows), pid)
        position = {"index": index, "part": part, "parts": len(starts), "env_steps": env_steps}
        tables.append(
            table.replace_schema_metadata(
                {
                    **table.schema.metadata,
                    **shared,
                    b"marl_runner.policy_id": pid.encode(),
                    b"marl_runner.batch": json.dumps(position).encode(),
                }
            )
        )
    return tables


def _data_file_name(index: int, part: int) -> str:
    return f"batch_{index:06d}.parquet" if part == 0 else f"batch_{index:06d}_{part:03d}.parquet"


def _write_table(path: Path, table: pa.Table, compression: str, written: list[Path]) -> None:
    write_atomically(path, lambda file: pq.write_table(table, file, compression=compression))
    written.append(path)


def _read_table(path: Path) -> SampleBatch:
    """One data file: only the columns its records name, after checking their declared and
    their decoded size."""
    try:
        with open_regular_file(path) as file:
            file_bytes = os.fstat(file.fileno()).st_size
            limit = max_read_bytes(file_bytes)
            parquet_file = pq.ParquetFile(file)
            records = read_records(parquet_file.schema_arrow, path)
            columns = list(dict.fromkeys(record["column"] for record in records))
            declared = _declared_bytes(parquet_file, columns, path)
            if declared > limit:
                raise BatchFileError(
                    path,
                    f"its columns {shortened(columns)} declare {declared:,} bytes uncompressed, "
                    f"more than {limit:,} ({MAX_EXPANSION}x its {file_bytes:,} bytes on disk "
                    f"+ {READ_ALLOWANCE:,})",
                )
            table = read_bounded(parquet_file, file, columns, path, limit)
    except FileRefused as exc:
        raise BatchFileError(path, f"it {exc}") from None
    except OSError as exc:
        raise BatchFileError(path, exc.strerror or str(exc)) from None
    except pa.ArrowException as exc:
        raise BatchFileError(path, str(exc)) from None
    except UnicodeDecodeError as exc:  # a column name in the footer: pyarrow decodes it late
        raise BatchFileError(
            path, f"its schema names a column in bytes that are not UTF-8: {exc}"
        ) from None
    return table_to_batch(table, records, path, limit)


def _declared_bytes(parquet_file: pq.ParquetFile, columns: list[str], path: Path) -> int:
    """Uncompressed bytes of ``columns`` in every row group, as the file's footer declares."""
    fields = parquet_file.schema_arrow
    leaf_owner: list[str] = []
    for arrow_field in fields:
        leaf_owner += [arrow_field.name] * leaf_count(arrow_field.type)
    metadata = parquet_file.metadata
    if len(leaf_owner) != metadata.num_columns:
        raise BatchFileError(path, "its schema and its column chunks do not agree")
    wanted = set(columns)
    total = 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for leaf, owner in enumerate(leaf_owner):
            if owner in wanted:
                total += max(row_group.column(leaf).total_uncompressed_size, 0)
    return total


def _space_spec(space: Any) -> dict[str, Any]:
    """The config form of a space; a space the config cannot express is named by its repr."""
    try:
        return space_to_spec(space)
    except ConfigError:
        return {"type": type(space).__name__, "repr": repr(space)}
