"""Batch files: one sampled batch per file, written atomically, read back exactly.

One ``MultiAgentBatch`` per file, ``batch_000001.npz`` and so on, so a
consumer can pick up files while the sampler is still writing. Each file is
written to a hidden temp file in the same directory, fsynced, then renamed
into place (``os.replace`` is atomic on one file system): a reader never
sees a half-written batch, and a crash leaves at most a stray ``.tmp`` file
that ``read_batches`` skips. ``format="parquet"`` writes the same batches as
Parquet episode tables instead (``marl_runner.io.parquet``, docs/DATA.md);
``read_batches`` reads either back into equal batches.

File format (a regular ``.npz``, i.e. a zip of ``.npy`` arrays, readable
by anyone with numpy and never unpickled)::

    data = np.load("out/batch_000001.npz")
    data["archer/obs"]                  # policy "archer"'s obs column, shape [n, ...]
    data["archer/obs/action_mask"]      # a Dict obs: one entry per leaf
    json.loads(data["archer/infos"][0]) # infos: one JSON text per row

- ``header``: a uint8 array holding UTF-8 JSON::

      {"format": "marl-runner-batch", "version": 2, "env_steps": 200,
       "agent_steps": 800, "policies": [{"id": "archer", "columns": [
           {"name": "obs", "encoding": "array"},
           {"name": "actions", "encoding": "nested",
            "structure": {"move": "archer/actions/move", ...}},
           {"name": "infos", "encoding": "json"}, ...]}, ...]}

- one entry per column, named ``<policy id>/<column>``. Numeric, bool and
  string columns are stored as they are. Nested columns (Dict / Tuple obs or
  actions) are stored leaf by leaf as ``<policy id>/<column>/<key>`` (tuple
  positions as ``0``, ``1`` ..., recorded as ``{"__tuple__": [...]}``); ``read_batches`` puts them back together
  from the header's ``structure``. An object column whose rows are alike
  dicts of arrays (a Dict obs without connectors) is stored the same way,
  key by key (encoding ``row_dicts``), and read back as one dict per row.
  Other object columns (``infos``) are stored as one JSON text per row:
  numpy values become numbers and lists, tuples lists.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.io.atomic import fsync_directory, write_atomically
from marl_runner.io.json_rows import row_to_json
from marl_runner.io.row_dicts import stack_row_dicts, unstack_row_dicts

__all__ = [
    "FORMATS", "batch_path", "list_batch_files", "read_batch", "read_batches", "write_batch"
]

FORMAT_NAME = "marl-runner-batch"
FORMAT_VERSION = 2
FORMATS = ("npz", "parquet")
_BATCH_FILE = re.compile(r"batch_(\d+)\.npz")
_MANIFEST_FILE = re.compile(r"batch_(\d+)\.json")


def batch_path(out_dir: str | Path, index: int) -> Path:
    """Where batch number ``index`` lives: ``out_dir/batch_000001.npz``."""
    return Path(out_dir) / f"batch_{index:06d}.npz"


def write_batch(
    batch: MultiAgentBatch,
    out_dir: str | Path,
    index: int,
    format: str = "npz",
    *,
    metadata: Mapping[str, Any] | None = None,
    **parquet_options: Any,
) -> Path:
    """Writes ``batch`` atomically as batch number ``index`` and returns its path.

    Creates ``out_dir`` if needed. Refuses to overwrite an existing batch file
    (``FileExistsError``), since that would mix two runs in one directory.
    ``format="parquet"`` needs pyarrow and returns the batch's manifest;
    ``metadata`` (``parquet_metadata(runner)``) and ``max_rows_per_file`` /
    ``compression`` go to ``marl_runner.io.parquet.write_parquet_batch``.
    """
    if not isinstance(batch, MultiAgentBatch):
        raise TypeError(f"write_batch expects a MultiAgentBatch, got {type(batch).__name__}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"write_batch: index must be an integer >= 0, got {index!r}")
    if format not in FORMATS:
        raise ValueError(f"write_batch: format {format!r} is not one of {list(FORMATS)}")
    out_dir = Path(out_dir)
    if format == "parquet":
        write_parquet_batch = _parquet_io().write_parquet_batch
        out_dir.mkdir(parents=True, exist_ok=True)
        return write_parquet_batch(batch, out_dir, index, metadata=metadata, **parquet_options)
    if metadata is not None or parquet_options:
        given = ["metadata"] * (metadata is not None) + sorted(parquet_options)
        raise ValueError(f"write_batch: {given} apply to format='parquet' only")
    out_dir.mkdir(parents=True, exist_ok=True)
    final_path = batch_path(out_dir, index)
    if final_path.exists():
        raise FileExistsError(
            f"write_batch: {final_path} already exists; write to an empty directory"
        )

    arrays, header = _encode(batch)
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    write_atomically(final_path, lambda file: np.savez(file, allow_pickle=False, **arrays))
    fsync_directory(out_dir)
    return final_path


def list_batch_files(directory: str | Path) -> list[Path]:
    """Batch files in ``directory`` in index order; temp files and other files are skipped.

    A Parquet batch is listed by its manifest (``batch_000001.json``), which
    exists once all of the batch's files do.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"batch directory {directory} does not exist")
    found = []
    for entry in directory.iterdir():
        match = _BATCH_FILE.fullmatch(entry.name) or _MANIFEST_FILE.fullmatch(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry.suffix, entry))
    return [path for _, _, path in sorted(found)]


def read_batches(directory: str | Path) -> Iterator[MultiAgentBatch]:
    """Yields every batch in ``directory`` in index order (one file loaded at a time)."""
    for path in list_batch_files(directory):
        yield read_batch(path)


def read_batch(path: str | Path) -> MultiAgentBatch:
    """Loads one batch file written by ``write_batch`` (a Parquet batch by its manifest)."""
    path = Path(path)
    if path.suffix == ".json":
        return _parquet_io().read_parquet_batch(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(data["header"].tobytes().decode("utf-8"))
            if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
                raise ValueError(
                    f"unsupported format {header.get('format')!r} version {header.get('version')!r}; "
                    f"expected {FORMAT_NAME!r} version {FORMAT_VERSION}"
                )
            policy_batches = {
                policy["id"]: SampleBatch(
                    {
                        col["name"]: _decode_column(data, f"{policy['id']}/{col['name']}", col)
                        for col in policy["columns"]
                    }
                )
                for policy in header["policies"]
            }
    except (OSError, EOFError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a readable marl-runner batch file: {exc}") from exc
    return MultiAgentBatch(policy_batches, env_steps=header["env_steps"])


def _encode(batch: MultiAgentBatch) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Splits a batch into named arrays and the JSON header that describes them."""
    arrays: dict[str, np.ndarray] = {}
    policies = []
    for policy_id, sample_batch in batch.policy_batches.items():
        if not isinstance(policy_id, str) or not policy_id or "/" in policy_id:
            raise TypeError(
                f"write_batch: policy ids must be strings without '/', got {policy_id!r}"
            )
        columns = [
            _encode_column(arrays, f"{policy_id}/{_part(name)}", name, column)
            for name, column in sample_batch.items()
        ]
        policies.append({"id": policy_id, "columns": columns})
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "env_steps": batch.env_steps(),
        "agent_steps": batch.agent_steps(),
        "policies": policies,
    }
    return arrays, header


def _encode_column(
    arrays: dict[str, np.ndarray], entry: str, name: str, column: Any
) -> dict[str, Any]:
    if isinstance(column, (dict, tuple)):
        return {
            "name": name,
            "encoding": "nested",
            "structure": _store_leaves(arrays, entry, column),
        }
    column = np.asarray(column)
    stacked = None
    if column.dtype == object and name != SampleBatch.INFOS:
        stacked = stack_row_dicts(column)
    if stacked is not None:
        structure = _store_leaves(arrays, entry, stacked)
        return {"name": name, "encoding": "row_dicts", "structure": structure}
    if column.dtype == object:
        arrays[entry] = np.array([row_to_json(value, entry) for value in column], dtype=np.str_)
        return {"name": name, "encoding": "json"}
    arrays[entry] = column
    return {"name": name, "encoding": "array"}


def _store_leaves(arrays: dict[str, np.ndarray], entry: str, value: Any) -> Any:
    """Stores each leaf of a nested column; returns its structure with entry names as leaves."""
    if isinstance(value, dict):
        return {str(k): _store_leaves(arrays, f"{entry}/{_part(k)}", v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {
            "__tuple__": [_store_leaves(arrays, f"{entry}/{i}", v) for i, v in enumerate(value)]
        }
    leaf = np.asarray(value)
    if leaf.dtype == object:
        raise TypeError(f"write_batch: nested column entry {entry!r} holds Python objects")
    arrays[entry] = leaf
    return entry


def _part(name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name:
        raise TypeError(
            f"write_batch: column names and keys must be strings without '/', got {name!r}"
        )
    return name


def _decode_column(data: Any, entry: str, column: dict[str, Any]) -> Any:
    encoding = column["encoding"]
    if encoding == "array":
        return data[entry]
    if encoding == "json":
        rows = data[entry]
        decoded = np.empty(len(rows), dtype=object)
        decoded[:] = [json.loads(str(text)) for text in rows]
        return decoded
    if encoding == "nested":
        return _load_leaves(data, column["structure"])
    if encoding == "row_dicts":
        return unstack_row_dicts(_load_leaves(data, column["structure"]))
    raise ValueError(f"unknown column encoding {encoding!r}")


def _load_leaves(data: Any, structure: Any) -> Any:
    if isinstance(structure, str):
        return data[structure]
    if set(structure) == {"__tuple__"}:
        return tuple(_load_leaves(data, part) for part in structure["__tuple__"])
    return {key: _load_leaves(data, part) for key, part in structure.items()}


def _parquet_io() -> Any:
    """``marl_runner.io.parquet``, imported on first use: pyarrow is an optional extra."""
    try:
        import marl_runner.io.parquet as parquet
    except ImportError as exc:
        raise ImportError(
            f"the parquet batch format needs pyarrow ({exc}); install it with: "
            "pip install 'marl-runner[parquet]'"
        ) from exc
    return parquet
