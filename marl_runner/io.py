"""Writing sampled batches to disk and reading them back.

One ``MultiAgentBatch`` per file, ``batch_000001.npz`` and so on, so a
consumer can pick up files while the sampler is still writing. Each file is
written to a hidden temp file in the same directory, fsynced, then renamed
into place (``os.replace`` is atomic on one file system): a reader never
sees a half-written batch, and a crash leaves at most a stray ``.tmp`` file
that ``read_batches`` skips.

File format (a regular ``.npz``, i.e. a zip of ``.npy`` arrays):

- ``header``: a uint8 array holding UTF-8 JSON::

      {"format": "marl-runner-batch", "version": 1, "env_steps": 200,
       "agent_steps": 800,
       "policies": [{"id": "archer", "columns": [
           {"name": "obs", "key": "c0", "encoding": "array"},
           {"name": "infos", "key": "c1", "encoding": "pickle"}, ...]}, ...]}

- one entry per column, named by ``key``. Numeric/bool/string columns are
  stored as plain arrays and loaded with ``allow_pickle=False``. Object
  columns (``infos``, nested structures) are stored as pickle bytes in a
  uint8 array and unpickled only for that column. Unpickling runs code from
  the file, so only read batch directories you trust (as with ``torch.load``).
"""

from __future__ import annotations

import json
import os
import pickle
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
FORMAT_VERSION = 1
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
                        col["name"]: _decode_column(data[col["key"]], col["encoding"])
                        for col in policy["columns"]
                    }
                )
                for policy in header["policies"]
            }
    except (
        OSError,
        EOFError,
        KeyError,
        ValueError,
        zipfile.BadZipFile,
        pickle.UnpicklingError,
    ) as exc:
        raise ValueError(f"{path} is not a readable marl-runner batch file: {exc}") from exc
    return MultiAgentBatch(policy_batches, env_steps=header["env_steps"])


def _encode(batch: MultiAgentBatch) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Splits a batch into named arrays and the JSON header that describes them."""
    arrays: dict[str, np.ndarray] = {}
    policies = []
    for policy_id, sample_batch in batch.policy_batches.items():
        if not isinstance(policy_id, str):
            raise TypeError(f"write_batch: policy ids must be strings, got {policy_id!r}")
        columns = []
        for name, column in sample_batch.items():
            key = f"c{len(arrays)}"
            if isinstance(column, np.ndarray) and column.dtype != object:
                arrays[key] = column
                encoding = "array"
            else:
                arrays[key] = np.frombuffer(
                    pickle.dumps(column, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8
                )
                encoding = "pickle"
            columns.append({"name": name, "key": key, "encoding": encoding})
        policies.append({"id": policy_id, "columns": columns})
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "env_steps": batch.env_steps(),
        "agent_steps": batch.agent_steps(),
        "policies": policies,
    }
    return arrays, header


def _decode_column(stored: np.ndarray, encoding: str) -> Any:
    if encoding == "array":
        return stored
    if encoding == "pickle":
        return pickle.loads(stored.tobytes())
    raise ValueError(f"unknown column encoding {encoding!r}")


def _fsync_directory(directory: Path) -> None:
    """Makes the rename itself durable; only POSIX lets a directory be opened for this."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
