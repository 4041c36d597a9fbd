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
import math
import os
import re
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import tree

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.io.atomic import fsync_directory, write_atomically
from marl_runner.io.batch_checks import (
    BatchFileError,
    check_column_dtype,
    field,
    load_json,
    shortened,
)
from marl_runner.io.json_rows import row_namer, rows_to_json
from marl_runner.io.row_dicts import stack_row_dicts, unstack_row_dicts
from marl_runner.safe_files import FileRefused, open_regular_file

__all__ = ["FORMATS", "batch_path", "list_batch_files", "read_batch", "read_batches", "write_batch"]

FORMAT_NAME = "marl-runner-batch"
FORMAT_VERSION = 2
FORMATS = ("npz", "parquet")
_BATCH_FILE = re.compile(r"batch_(\d+)\.npz")
_MANIFEST_FILE = re.compile(r"batch_(\d+)\.json")
_HEADER_FIELDS = ("format", "version", "env_steps", "agent_steps", "policies")
_ENCODINGS = ("array", "json", "nested", "row_dicts")
_STRUCTURED = ("nested", "row_dicts")
#: numpy kinds an entry may hold: bool, ints, floats, complex, str, bytes; never objects.
_ARRAY_KINDS = "biufcUS"
_MAX_NDIM = 32
_NPY_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}
#: What zipfile raises for a damaged archive or member: bad CRC or local header, and
#: RuntimeError (NotImplementedError included) for an unknown zip version or an encryption.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, EOFError, OSError)


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
    """Loads one batch file written by ``write_batch`` (a Parquet batch by its manifest).

    The file is data that may have been crafted, and is checked before any
    array is allocated (see ``_NpzReader``): a ``ValueError`` naming the file
    and the field, never more memory than about the file's size.
    """
    path = Path(path)
    if path.suffix == ".json":
        return _parquet_io().read_parquet_batch(path)
    try:
        file = open_regular_file(path)
    except FileRefused as exc:
        raise BatchFileError(path, f"it {exc}") from None
    except OSError as exc:
        raise BatchFileError(path, exc.strerror or str(exc)) from None
    with file:
        return _NpzReader(path, file).read()


class _NpzReader:
    """One ``.npz`` batch file, read with every header field, reference and size checked.

    - the zip holds ``.npy`` members only, each once, stored uncompressed, and
      together no larger than the file: the arrays read never take more memory
      than the bytes on disk;
    - the JSON header nests at most ``MAX_JSON_DEPTH`` levels, and every field
      has its type; a column's entries are its own (``<policy>/<column>...``)
      and each entry is named by one field only;
    - each ``.npy`` header declares a plain dtype (numbers, bools, strings:
      no objects, no records) and a shape whose bytes are exactly those stored;
    - columns with a meaning have a dtype that fits it (``check_column_dtype``).
    """

    def __init__(self, path: Path, file: BinaryIO) -> None:
        self.path = path
        self.file_bytes = os.fstat(file.fileno()).st_size
        try:
            self.archive = zipfile.ZipFile(file)
        except (*_ZIP_ERRORS, ValueError) as exc:
            raise BatchFileError(path, f"it is not a zip of .npy arrays ({exc})") from None
        self.members = self._members()
        self.named_by: dict[str, str] = {}  # entry -> the field that named it

    def _members(self) -> dict[str, zipfile.ZipInfo]:
        members: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in self.archive.infolist():
            entry = info.filename.removesuffix(".npy")
            if entry == info.filename:
                raise self.error(f"zip member {shortened(info.filename)} is not a .npy array")
            if entry in members:
                raise self.error(f"zip member {shortened(info.filename)} appears twice")
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                raise self.error(
                    f"entry {shortened(entry)} is compressed; batch files store their arrays "
                    "uncompressed, so that reading one takes no more memory than its size on disk"
                )
            members[entry] = info
            total += info.file_size
        if total > self.file_bytes:
            raise self.error(
                f"its entries declare {total:,} bytes, more than the file's {self.file_bytes:,}"
            )
        return members

    def error(self, problem: str) -> BatchFileError:
        return BatchFileError(self.path, problem)

    def read(self) -> MultiAgentBatch:
        raw = self.array("header", "header")
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise self.error(f"entry 'header' is {raw.dtype} {list(raw.shape)}; expected uint8 [n]")
        header = load_json(raw.tobytes(), self.path, "header")
        if not isinstance(header, dict):
            raise self.error(
                f"its header is {shortened(header)}, a JSON {type(header).__name__}; "
                "expected a JSON object"
            )
        if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
            raise self.error(
                f"unsupported format {shortened(header.get('format'))} version "
                f"{shortened(header.get('version'))}; expected {FORMAT_NAME!r} version "
                f"{FORMAT_VERSION}"
            )
        unknown = sorted(set(header) - set(_HEADER_FIELDS))
        if unknown:
            raise self.error(
                f"header has unknown fields {shortened(unknown)}; expected {list(_HEADER_FIELDS)}"
            )
        env_steps = self.count(header, "env_steps")
        agent_steps = self.count(header, "agent_steps")
        policies = field(header, "policies", list, self.path, "policies")
        policy_batches: dict[str, SampleBatch] = {}
        for i, policy in enumerate(policies):
            pid = field(policy, "id", str, self.path, f"policies[{i}].id")
            columns = field(policy, "columns", list, self.path, f"policies[{i}].columns")
            if pid in policy_batches or "/" in pid or set(policy) != {"id", "columns"}:
                raise self.error(
                    f"field 'policies[{i}]' is {shortened(policy)}; expected {{'id', 'columns'}} "
                    "with an id without '/' that no other policy has"
                )
            batch = policy_batches[pid] = SampleBatch()
            for j, column in enumerate(columns):
                name, values = self.column(pid, column, f"policies[{i}].columns[{j}]")
                batch[name] = values  # a name twice would name its entry twice: refused
            self.check_rows(pid, batch)
        batch = MultiAgentBatch(policy_batches, env_steps=env_steps)
        if batch.agent_steps() != agent_steps:
            raise self.error(
                f"field 'agent_steps' is {agent_steps}, but its columns hold "
                f"{batch.agent_steps()} rows"
            )
        return batch

    def check_rows(self, pid: str, batch: SampleBatch) -> None:
        """Every column, and every part of a nested one, has rows, as many as the others:
        a shorter one misaligned rows or failed later in a bare IndexError."""
        rows_of: dict[int | None, str] = {}
        for name, values in batch.items():
            for leaf in tree.flatten(values):
                rows = len(leaf) if isinstance(leaf, np.ndarray) and leaf.ndim else None
                rows_of.setdefault(rows, name)
        if len(rows_of) > 1 or None in rows_of:
            found = ", ".join(
                f"{name!r} {'no rows' if rows is None else rows}" for rows, name in rows_of.items()
            )
            raise self.error(
                f"policy {pid!r}: its columns hold different numbers of rows ({found}); "
                "expected one row count, every column an array of rows"
            )

    def count(self, header: dict[str, Any], key: str) -> int:
        value = field(header, key, int, self.path, key)
        if value < 0:
            raise self.error(f"field {key!r} is {value}; expected an integer >= 0")
        return value

    def column(self, pid: str, column: Any, where: str) -> tuple[str, Any]:
        name = field(column, "name", str, self.path, f"{where}.name")
        encoding = field(column, "encoding", str, self.path, f"{where}.encoding")
        if encoding not in _ENCODINGS:
            raise self.error(
                f"field '{where}.encoding' is {shortened(encoding)}; expected one of "
                f"{list(_ENCODINGS)}"
            )
        expected = (
            {"name", "encoding", "structure"} if encoding in _STRUCTURED else {"name", "encoding"}
        )
        if set(column) != expected or not name or "/" in name:
            raise self.error(
                f"field {where!r} is {shortened(column)}; expected the fields {sorted(expected)} "
                "and a name without '/'"
            )
        entry = f"{pid}/{name}"
        if encoding == "array":
            values = self.array(entry, f"{where} ({entry})")
            check_column_dtype(name, values.dtype, self.path, entry)
            return name, values
        if encoding == "json":
            return name, self.json_rows(entry, f"{where} ({entry})")
        structure = column["structure"]
        leaves = self.leaves(structure, entry, f"{where}.structure")
        if encoding == "nested":
            return name, leaves
        if not isinstance(leaves, dict) or not _alike_rows(leaves):
            raise self.error(f"field '{where}.structure' does not describe alike dicts of arrays")
        return name, unstack_row_dicts(leaves)

    def leaves(self, structure: Any, prefix: str, where: str) -> Any:
        """The arrays a nested structure names, put back together (depth bounded by the
        JSON depth limit)."""
        if isinstance(structure, str):
            if not structure.startswith(prefix + "/"):
                raise self.error(
                    f"field {where!r} names the entry {shortened(structure)}; expected one "
                    f"under {prefix + '/'!r}"
                )
            return self.array(structure, where)
        if isinstance(structure, dict) and structure:
            if set(structure) == {"__tuple__"}:
                parts = structure["__tuple__"]
                if isinstance(parts, list) and parts:
                    return tuple(
                        self.leaves(part, prefix, f"{where}.__tuple__[{i}]")
                        for i, part in enumerate(parts)
                    )
            else:
                return {
                    key: self.leaves(part, prefix, f"{where}.{key}")
                    for key, part in structure.items()
                }
        raise self.error(
            f"field {where!r} is {shortened(structure)}; expected an entry name, a non-empty "
            "object of them or {'__tuple__': [...]}"
        )

    def json_rows(self, entry: str, where: str) -> np.ndarray:
        texts = self.array(entry, where)
        if texts.dtype.kind != "U" or texts.ndim != 1:
            raise self.error(
                f"entry {entry!r} is {texts.dtype.str} {list(texts.shape)}; expected one JSON "
                "text per row"
            )
        rows = np.empty(len(texts), dtype=object)
        try:
            rows[:] = [json.loads(str(text)) for text in texts]
        except RecursionError:
            raise self.error(f"a row of entry {entry!r} is nested too deeply") from None
        except ValueError as exc:
            raise self.error(f"a row of entry {entry!r} is not JSON: {exc}") from None
        return rows

    def array(self, entry: str, where: str) -> np.ndarray:
        """Entry ``entry``, checked before its bytes are allocated; each entry once only."""
        info = self.members.get(entry)
        if info is None:
            raise self.error(
                f"field {where!r} names the entry {shortened(entry)}, which the file does not hold"
            )
        if entry in self.named_by:
            raise self.error(
                f"fields {self.named_by[entry]!r} and {where!r} both name the entry {entry!r}; "
                "expected each entry to be named once"
            )
        self.named_by[entry] = where
        try:
            return self._read_member(info, entry)
        except _ZIP_ERRORS as exc:  # a damaged member: bad CRC, local header, zip version ...
            raise self.error(f"entry {entry!r} is damaged: {type(exc).__name__}: {exc}") from None

    def _read_member(self, info: zipfile.ZipInfo, entry: str) -> np.ndarray:
        with self.archive.open(info) as member:
            try:
                version = np.lib.format.read_magic(member)
                if version not in _NPY_HEADER_READERS:
                    raise ValueError(f"npy format version {version} is not supported")
                shape, fortran_order, dtype = _NPY_HEADER_READERS[version](member)
            except (ValueError, EOFError, SyntaxError, TypeError) as exc:
                raise self.error(f"entry {entry!r} has no valid .npy header: {exc}") from None
            stored = info.file_size - member.tell()
            if (
                dtype.kind not in _ARRAY_KINDS
                or dtype.fields is not None
                or dtype.subdtype is not None
            ):
                raise self.error(
                    f"entry {entry!r} has dtype {dtype}; expected numbers, bools or strings"
                )
            declared = math.prod(shape) * dtype.itemsize
            if (
                len(shape) > _MAX_NDIM
                or min(shape, default=0) < 0  # (-2, -4): numpy's reader takes it, 8 bytes
                or declared != stored
                or (math.prod(max(n, 1) for n in shape) > max(self.file_bytes, 1))
            ):
                raise self.error(
                    f"entry {entry!r} declares shape {shortened(list(shape))} of {dtype.str} "
                    f"({declared:,} bytes), but stores {stored:,} bytes"
                )
            data = bytearray(declared)
            if member.readinto(data) != declared:
                raise self.error(f"entry {entry!r} ends before its {declared:,} bytes")
        if not declared:
            return np.empty(shape, dtype)
        values = np.frombuffer(data, dtype)
        return values.reshape(shape[::-1]).T if fortran_order else values.reshape(shape)


def _alike_rows(leaves: dict[str, Any]) -> bool:
    """Whether the leaves of a ``row_dicts`` structure are arrays with one equal row count."""
    lengths = set()
    stack: list[Any] = [leaves]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, np.ndarray) and node.ndim:
            lengths.add(len(node))
        else:
            return False
    return len(lengths) == 1


def _encode(batch: MultiAgentBatch) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Splits a batch into named arrays and the JSON header that describes them."""
    arrays: dict[str, np.ndarray] = {}
    policies = []
    for policy_id, sample_batch in batch.policy_batches.items():
        if not isinstance(policy_id, str) or not policy_id or "/" in policy_id:
            raise TypeError(
                f"write_batch: policy ids must be strings without '/', got {policy_id!r}"
            )
        row_name = row_namer(sample_batch)
        columns = [
            _encode_column(arrays, f"{policy_id}/{_part(name)}", name, column, row_name)
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
    arrays: dict[str, np.ndarray],
    entry: str,
    name: str,
    column: Any,
    row_name: Callable[[int], str],
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
        arrays[entry] = np.array(rows_to_json(column, entry, row_name), dtype=np.str_)
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
