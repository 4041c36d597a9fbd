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
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from marl_runner.batch import SampleBatch
from marl_runner.io.json_rows import row_to_json
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


def batch_to_table(batch: SampleBatch, policy_id: str) -> pa.Table:
    """The rows of ``batch`` (policy ``policy_id``'s) as a table."""
    rows = len(batch)
    columns: dict[str, pa.Array] = {}
    source = {"policy_id": "the policy id"}
    records = []
    for name, column in batch.items():
        table_name = COLUMN_RENAMES.get(name, name)
        if table_name in source:
            raise ValueError(
                f"write_batch: policy {policy_id!r}: column {name!r} would be stored as "
                f"{table_name!r}, which {source[table_name]} already uses; rename one of them"
            )
        source[table_name] = f"column {name!r}"
        array, record = _encode_column(name, column, f"{policy_id}/{name}", rows)
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


def table_to_batch(table: pa.Table) -> SampleBatch:
    """The SampleBatch ``batch_to_table`` stored, same column order, dtypes and shapes."""
    records = json.loads((table.schema.metadata or {})[COLUMNS_KEY])
    rows = table.num_rows
    batch = SampleBatch()
    for record in records:
        array = table.column(record["column"]).combine_chunks()
        batch[record["name"]] = _decode_column(array, record, rows)
    return batch


def _encode_column(
    name: str, column: Any, where: str, rows: int
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
        texts = [row_to_json(value, where) for value in column]
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
    array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _leaf_record(values: np.ndarray) -> dict[str, Any]:
    return {"dtype": values.dtype.str, "shape": list(values.shape[1:])}


def _decode_column(array: pa.Array, record: Mapping[str, Any], rows: int) -> Any:
    encoding = record["encoding"]
    if encoding == "array":
        return _decode_array(array, record, rows)
    if encoding == "json":
        decoded = np.empty(rows, dtype=object)
        decoded[:] = [json.loads(text) for text in array.to_pylist()]
        return decoded
    if encoding == "nested":
        return _decode_nested(array, record["structure"], rows)
    if encoding == "row_dicts":
        return unstack_row_dicts(_decode_nested(array, record["structure"], rows))
    raise ValueError(f"column {record['column']!r}: unknown encoding {encoding!r}")


def _decode_nested(array: pa.StructArray, structure: Any, rows: int) -> Any:
    if "dtype" in structure:
        return _decode_array(array, structure, rows)
    if set(structure) == {"__tuple__"}:
        return tuple(
            _decode_nested(array.field(str(i)), part, rows)
            for i, part in enumerate(structure["__tuple__"])
        )
    return {key: _decode_nested(array.field(key), part, rows) for key, part in structure.items()}


def _decode_array(array: pa.Array, record: Mapping[str, Any], rows: int) -> np.ndarray:
    dtype, shape = np.dtype(record["dtype"]), tuple(record["shape"])
    for _ in shape:
        array = array.flatten()
    if dtype.kind in "US":
        values = np.array(array.to_pylist(), dtype=dtype)
    else:
        values = array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        # Arrow hands out read-only views of its buffers; a batch read back must be as
        # writable as the one written (trainers normalise columns in place, torch warns).
        values = np.require(values, requirements="W")
    return values.reshape((rows, *shape))
