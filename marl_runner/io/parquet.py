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
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from marl_runner import __version__
from marl_runner.batch import MultiAgentBatch, SampleBatch, concat_samples
from marl_runner.config import ConfigError, space_to_spec
from marl_runner.io.atomic import fsync_directory, write_atomically
from marl_runner.io.parquet_columns import batch_to_table, table_to_batch

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
            "project_version": __version__,
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
    """Loads the batch a manifest names, with exactly the columns that were written."""
    try:
        content = json.loads(manifest.read_text(encoding="utf-8"))
        if content.get("format") != FORMAT_NAME or content.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"unsupported format {content.get('format')!r} version "
                f"{content.get('version')!r}; expected {FORMAT_NAME!r} version {FORMAT_VERSION}"
            )
        policy_batches = {}
        for pid, names in content["files"].items():
            parts = [_read_table(manifest.parent / name) for name in names]
            policy_batches[pid] = parts[0] if len(parts) == 1 else concat_samples(parts)
        return MultiAgentBatch(policy_batches, env_steps=content["env_steps"])
    except (OSError, KeyError, TypeError, ValueError, AttributeError, pa.ArrowException) as exc:
        raise ValueError(f"{manifest} is not a readable marl-runner batch file: {exc}") from exc


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
        b"marl_runner.version": __version__.encode(),
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
    return table_to_batch(pq.read_table(path))


def _space_spec(space: Any) -> dict[str, Any]:
    """The config form of a space; a space the config cannot express is named by its repr."""
    try:
        return space_to_spec(space)
    except ConfigError:
        return {"type": type(space).__name__, "repr": repr(space)}
