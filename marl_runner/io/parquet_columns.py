"""One policy's SampleBatch as an Arrow table with plain types, and back, exactly.

The table uses only standard Arrow types, so pandas, polars, DuckDB, Ray Data
and ``pyarrow.dataset`` read it without this project: numbers and bools stay
themselves (images stay uint8), fixed-shape arrays become (nested)
fixed-size lists, Dict / Tuple columns become structs (a Dict obs keeps its
``action_mask`` as a field, also when its rows are dicts in an object
column), other object columns such as ``infos`` become one JSON text per row. Some columns are renamed to the episode-table names
(``COLUMN_RENAMES``); ``policy_id`` is added, and ``agent_id`` / ``env_t`` are
null when the batch does not carry them. The per-column record that
``table_to_batch`` needs to give back the very same columns (names, order,
numpy dtypes, shapes, nesting) travels in the schema metadata.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from marl_runner.batch import SampleBatch
from marl_runner.io.batch_checks import (
    BatchFileError,
    check_column_dtype,
    field,
    load_json,
    shortened,
)
from marl_runner.io.json_rows import row_namer, rows_to_json
from marl_runner.io.row_dicts import stack_row_dicts, unstack_row_dicts

#: SampleBatch column -> episode-table column, where the two names differ.
COLUMN_RENAMES = {
    "env_id": "env_index",
    "t": "agent_t",
    "terminateds": "terminated",
    "truncateds": "truncated",
}

#: Table columns in this order first; the rest follow in batch order, ``infos`` last.
LEADING_COLUMNS = (
    "eps_id", "agent_id", "policy_id", "env_index", "env_t", "agent_t",
    "obs", "new_obs", "actions", "rewards", "terminated", "truncated",
    "action_logp", "vf_preds", "policy_version",
)  # fmt: skip

#: Columns every table has, null when the batch lacks them, with their Arrow type.
ALWAYS_PRESENT = {"agent_id": pa.string(), "env_t": pa.int64()}

#: Schema metadata key holding the JSON list of column records.
COLUMNS_KEY = b"marl_runner.columns"

# numpy kinds stored as Arrow values: bool, ints, floats, str, bytes.
_ARRAY_KINDS = "biufUS"
_MAX_NDIM = 32
_ENCODINGS = ("array", "json", "nested", "row_dicts")


def batch_to_table(batch: SampleBatch, policy_id: str) -> pa.Table:
    """The rows of ``batch`` (policy ``policy_id``'s) as a table."""
    rows = len(batch)
    columns: dict[str, pa.Array] = {}
    source = {"policy_id": "the policy id"}
    records = []
    row_name = row_namer(batch)
    for name, column in batch.items():
        table_name = COLUMN_RENAMES.get(name, name)
        if table_name in source:
            raise ValueError(
                f"write_batch: policy {policy_id!r}: column {name!r} would be stored as "
                f"{table_name!r}, which {source[table_name]} already uses; rename one of them"
            )
        source[table_name] = f"column {name!r}"
        array, record = _encode_column(name, column, f"{policy_id}/{name}", rows, row_name)
        columns[table_name] = array
        records.append({"name": name, "column": table_name, **record})
    columns["policy_id"] = pa.array([policy_id] * rows, pa.string())
    for name, arrow_type in ALWAYS_PRESENT.items():
        columns.setdefault(name, pa.nulls(rows, arrow_type))
    order = [n for n in LEADING_COLUMNS if n in columns]
    order += [n for n in columns if n not in order and n != "infos"]
    order += ["infos"] if "infos" in columns else []
    table = pa.table({name: columns[name] for name in order})
    return table.replace_schema_metadata({COLUMNS_KEY: json.dumps(records)})


def read_records(schema: pa.Schema, path: Any) -> list[dict[str, Any]]:
    """The column records in a table's schema metadata, every field checked: each names a
    distinct column of the table, an encoding, and for arrays a plain dtype and shape."""
    raw = (schema.metadata or {}).get(COLUMNS_KEY)
    if raw is None:
        raise BatchFileError(path, f"its schema metadata has no {COLUMNS_KEY.decode()!r}")
    records = load_json(raw, path, "column records")
    if not isinstance(records, list):
        raise BatchFileError(path, f"its column records are {shortened(records)}; expected a list")
    names, columns = set(), set()
    for i, record in enumerate(records):
        where = f"{COLUMNS_KEY.decode()}[{i}]"
        name = field(record, "name", str, path, f"{where}.name")
        column = field(record, "column", str, path, f"{where}.column")
        encoding = field(record, "encoding", str, path, f"{where}.encoding")
        if name in names or column in columns or column not in schema.names:
            raise BatchFileError(
                path,
                f"field {where!r} names column {shortened(column)} for {shortened(name)}; expected "
                "a column of the table that no other record names",
            )
        names.add(name)
        columns.add(column)
        if encoding == "array":
            _leaf_dtype(record, path, where)
        elif encoding in ("nested", "row_dicts"):
            _check_structure(
                field(record, "structure", dict, path, f"{where}.structure"),
                path,
                f"{where}.structure",
            )
        elif encoding != "json":
            raise BatchFileError(
                path,
                f"field '{where}.encoding' is {shortened(encoding)}; expected one of "
                f"{list(_ENCODINGS)}",
            )
    return records


def table_to_batch(
    table: pa.Table,
    records: list[dict[str, Any]] | None = None,
    path: Any = "table",
    max_bytes: int | None = None,
) -> SampleBatch:
    """The SampleBatch ``batch_to_table`` stored, same column order, dtypes and shapes.

    ``records`` are the checked column records (``read_records`` of the table's
    schema when not given); no decoded column may take more than ``max_bytes``.
    ``path`` names the file in errors.
    """
    if records is None:
        records = read_records(table.schema, path)
    rows = table.num_rows
    batch = SampleBatch()
    decoder = _Decoder(path, rows, max_bytes)
    for record in records:
        name = record["name"]
        try:
            array = table.column(record["column"]).combine_chunks()
            batch[name] = decoder.column(array, record)
        except BatchFileError:
            raise
        except (
            ValueError,
            TypeError,
            AttributeError,
            KeyError,
            IndexError,
            pa.ArrowException,
        ) as exc:
            raise BatchFileError(
                path, f"column {record['column']!r} does not match its record: {exc}"
            ) from None
        if record["encoding"] == "array":
            check_column_dtype(name, batch[name].dtype, path, record["column"])
    return batch


def _leaf_dtype(record: Any, path: Any, where: str) -> tuple[np.dtype, tuple[int, ...]]:
    """A leaf record's dtype (bool, numbers, strings) and row shape, checked."""
    text = field(record, "dtype", str, path, f"{where}.dtype")
    shape = field(record, "shape", list, path, f"{where}.shape")
    try:
        dtype = np.dtype(text) if len(text) <= 16 else None
    except Exception:  # numpy's parser raises TypeError or ValueError, by the text
        dtype = None
    if (
        dtype is None
        or dtype.kind not in _ARRAY_KINDS
        or dtype.fields is not None
        or dtype.subdtype
        or dtype.itemsize == 0  # an unsized string: numpy would size it by the longest
    ):
        raise BatchFileError(
            path,
            f"field '{where}.dtype' is {shortened(text)}; expected a bool, number or sized "
            "string dtype",
        )
    if len(shape) > _MAX_NDIM or not all(type(n) is int and n >= 1 for n in shape):
        raise BatchFileError(
            path,
            f"field '{where}.shape' is {shortened(shape)}; expected at most {_MAX_NDIM} "
            "integers >= 1",
        )
    return dtype, tuple(shape)


def _check_structure(structure: Any, path: Any, where: str) -> None:
    """A nested column's structure: leaf records, non-empty objects of them, or
    ``{"__tuple__": [...]}`` (depth already bounded by the JSON depth limit)."""
    if isinstance(structure, dict) and "dtype" in structure:
        _leaf_dtype(structure, path, where)
        return
    if isinstance(structure, dict) and set(structure) == {"__tuple__"}:
        parts = structure["__tuple__"]
        if isinstance(parts, list) and parts:
            for i, part in enumerate(parts):
                _check_structure(part, path, f"{where}.__tuple__[{i}]")
            return
    elif isinstance(structure, dict) and structure:
        for key, part in structure.items():
            _check_structure(part, path, f"{where}.{key}")
        return
    raise BatchFileError(
        path,
        f"field {where!r} is {shortened(structure)}; expected a leaf record, a non-empty object "
        "of them or {'__tuple__': [...]}",
    )


class _Decoder:
    """Columns of one table back to numpy, none larger than ``max_bytes``."""

    def __init__(self, path: Any, rows: int, max_bytes: int | None) -> None:
        self.path, self.rows, self.max_bytes = path, rows, max_bytes

    def column(self, array: pa.Array, record: Mapping[str, Any]) -> Any:
        encoding = record["encoding"]
        self.refuse_nulls(array, record["column"])
        if encoding == "array":
            return self.array(array, record, record["column"])
        if encoding == "json":
            decoded = np.empty(self.rows, dtype=object)
            try:
                decoded[:] = [json.loads(text) for text in array.to_pylist()]
            except RecursionError:
                raise BatchFileError(
                    self.path, f"a row of column {record['column']!r} is nested too deeply"
                ) from None
            return decoded
        nested = self.nested(array, record["structure"], record["column"])
        return nested if encoding == "nested" else unstack_row_dicts(nested)

    def refuse_nulls(self, array: pa.Array, where: str) -> None:
        """Nulls (another writer's missing values) would read as NaN, 0 or False, or shift
        the rows of a list column: refused, naming the column."""
        if array.null_count:
            raise BatchFileError(
                self.path, f"column {where!r} holds {array.null_count} nulls (missing "
                "values); expected a value in every row",
            )

    def nested(self, array: pa.StructArray, structure: Any, where: str) -> Any:
        self.refuse_nulls(array, where)
        if "dtype" in structure:
            return self.array(array, structure, where)
        if set(structure) == {"__tuple__"}:
            return tuple(
                self.nested(array.field(str(i)), part, f"{where}.{i}")
                for i, part in enumerate(structure["__tuple__"])
            )
        return {
            key: self.nested(array.field(key), part, f"{where}.{key}")
            for key, part in structure.items()
        }

    def array(self, array: pa.Array, record: Mapping[str, Any], where: str) -> np.ndarray:
        dtype, shape = _leaf_dtype(record, self.path, where)
        size = self.rows * math.prod(shape) * dtype.itemsize
        if self.max_bytes is not None and size > self.max_bytes:
            raise BatchFileError(
                self.path,
                f"column {where!r}: {self.rows} rows of {dtype.str} {list(shape)} would take "
                f"{size:,} bytes, more than the {self.max_bytes:,} this file may decode to",
            )
        for _ in shape:
            array = array.flatten()
            self.refuse_nulls(array, where)
        return _decode_array(array, dtype, shape, self.rows)


def _encode_column(
    name: str, column: Any, where: str, rows: int, row_name: Callable[[int], str]
) -> tuple[pa.Array, dict[str, Any]]:
    if isinstance(column, (dict, tuple)):
        array, structure = _encode_nested(column, where)
        return array, {"encoding": "nested", "structure": structure}
    column = np.asarray(column)
    if column.ndim == 0 or len(column) != rows:
        raise ValueError(
            f"write_batch: column {where!r}: expected {rows} rows, got shape {list(column.shape)}"
        )
    if column.dtype == object:
        stacked = None if name == SampleBatch.INFOS else stack_row_dicts(column)
        if stacked is not None:
            array, structure = _encode_nested(stacked, where)
            return array, {"encoding": "row_dicts", "structure": structure}
        texts = rows_to_json(column, where, row_name)
        return pa.array(texts, pa.string()), {"encoding": "json"}
    return _encode_array(column, where), {"encoding": "array", **_leaf_record(column)}


def _encode_nested(value: Any, where: str) -> tuple[pa.Array, Any]:
    """A struct array for a Dict / Tuple column and its structure (leaf records as leaves)."""
    if isinstance(value, dict):
        names, parts = list(value), list(value.values())
    else:
        names, parts = [str(i) for i in range(len(value))], list(value)
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"write_batch: column {where!r}: nested keys must be non-empty strings, got {name!r}"
            )
    children, structures = [], []
    for name, part in zip(names, parts):
        if isinstance(part, (dict, tuple)):
            child, structure = _encode_nested(part, f"{where}/{name}")
        else:
            leaf = np.asarray(part)
            if leaf.dtype == object or leaf.ndim == 0:
                raise TypeError(
                    f"write_batch: column '{where}/{name}': nested entries must be numeric "
                    f"arrays with a row dimension, got {leaf.dtype} of shape {list(leaf.shape)}"
                )
            child, structure = _encode_array(leaf, f"{where}/{name}"), _leaf_record(leaf)
        children.append(child)
        structures.append(structure)
    if not children:
        raise TypeError(
            f"write_batch: column {where!r}: an empty Dict / Tuple column cannot be stored"
        )
    array = pa.StructArray.from_arrays(children, names=names)
    if isinstance(value, tuple):
        return array, {"__tuple__": structures}
    return array, dict(zip(names, structures))


def _encode_array(values: np.ndarray, where: str) -> pa.Array:
    """Rows of any fixed shape as nested fixed-size lists of Arrow values."""
    if values.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(
            f"write_batch: column {where!r}: numpy dtype {values.dtype} cannot be stored; expected bool, int, "
            f"float, str or bytes"
        )
    if 0 in values.shape[1:]:
        raise ValueError(
            f"write_batch: column {where!r}: rows of shape {list(values.shape[1:])} hold no values"
        )
    flat = np.ascontiguousarray(values).reshape(-1)
    if values.dtype.kind in "US":
        # From a numpy str/bytes array pyarrow cuts each value at its first NUL ("a\0b" -> "a").
        array = pa.array(flat.tolist(), pa.string() if values.dtype.kind == "U" else pa.binary())
    else:
        array = pa.array(flat)
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _leaf_record(values: np.ndarray) -> dict[str, Any]:
    return {"dtype": values.dtype.str, "shape": list(values.shape[1:])}


def _decode_array(
    array: pa.Array, dtype: np.dtype, shape: tuple[int, ...], rows: int
) -> np.ndarray:
    """The flat values of a column's rows (lists already flattened) as ``[rows, *shape]``."""
    if dtype.kind in "US":
        values = np.array(array.to_pylist(), dtype=dtype)
    else:
        values = array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        # Arrow hands out read-only views of its buffers; a batch read back must be as
        # writable as the one written (trainers normalise columns in place, torch warns).
        values = np.require(values, requirements="W")
    return values.reshape((rows, *shape))
