"""Writing sampled batches to disk and reading them back.

One ``MultiAgentBatch`` per file, ``batch_000001.npz`` and so on, so a
consumer can pick up files while the sampler is still writing. Each file is
written to a hidden temp file in the same directory, fsynced, then renamed
into place (``os.replace`` is atomic on one file system): a reader never
sees a half-written batch, and a crash leaves at most a stray ``.tmp`` file
that ``read_batches`` skips.

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
  from the header's ``structure``. Object columns (``infos``) are stored as
  one JSON text per row: numpy values become numbers and lists, tuples lists.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from marl_runner.batch import MultiAgentBatch, SampleBatch

__all__ = ["batch_path", "list_batch_files", "read_batch", "read_batches", "write_batch"]

FORMAT_NAME = "marl-runner-batch"
FORMAT_VERSION = 2
#: Files are readable by group and others, like the config saved next to them.
FILE_MODE = 0o644
_BATCH_FILE = re.compile(r"batch_(\d+)\.npz")


def batch_path(out_dir: str | Path, index: int) -> Path:
    """Where batch number ``index`` lives: ``out_dir/batch_000001.npz``."""
    return Path(out_dir) / f"batch_{index:06d}.npz"


def write_batch(batch: MultiAgentBatch, out_dir: str | Path, index: int) -> Path:
    """Writes ``batch`` atomically as batch number ``index`` and returns its path.

    Creates ``out_dir`` if needed. Refuses to overwrite an existing batch file
    (``FileExistsError``), since that would mix two runs in one directory.
    """
    if not isinstance(batch, MultiAgentBatch):
        raise TypeError(f"write_batch expects a MultiAgentBatch, got {type(batch).__name__}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"write_batch: index must be an integer >= 0, got {index!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final_path = batch_path(out_dir, index)
    if final_path.exists():
        raise FileExistsError(
            f"write_batch: {final_path} already exists; write to an empty directory"
        )

    arrays, header = _encode(batch)
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{final_path.stem}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as tmp_file:
            np.savez(tmp_file, allow_pickle=False, **arrays)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp_name, final_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(out_dir)
    return final_path


def list_batch_files(directory: str | Path) -> list[Path]:
    """Batch files in ``directory`` in index order; temp files and other files are skipped."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"batch directory {directory} does not exist")
    found = []
    for entry in directory.iterdir():
        match = _BATCH_FILE.fullmatch(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return [path for _, path in sorted(found)]


def read_batches(directory: str | Path) -> Iterator[MultiAgentBatch]:
    """Yields every batch in ``directory`` in index order (one file loaded at a time)."""
    for path in list_batch_files(directory):
        yield read_batch(path)


def read_batch(path: str | Path) -> MultiAgentBatch:
    """Loads one batch file written by ``write_batch``."""
    path = Path(path)
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
    if column.dtype == object:
        arrays[entry] = np.array([_to_json(entry, value) for value in column], dtype=np.str_)
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


def _to_json(entry: str, value: Any) -> str:
    try:
        return json.dumps(value, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"write_batch: a row of {entry!r} is not JSON-serialisable: {exc}"
        ) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r}")


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
    raise ValueError(f"unknown column encoding {encoding!r}")


def _load_leaves(data: Any, structure: Any) -> Any:
    if isinstance(structure, str):
        return data[structure]
    if set(structure) == {"__tuple__"}:
        return tuple(_load_leaves(data, part) for part in structure["__tuple__"])
    return {key: _load_leaves(data, part) for key, part in structure.items()}


def _fsync_directory(directory: Path) -> None:
    """Makes the rename itself durable; only POSIX lets a directory be opened for this."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
