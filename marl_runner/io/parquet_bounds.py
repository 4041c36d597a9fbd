"""Reading a Parquet data file's columns with their decoded size known before it is spent.

A footer's ``total_uncompressed_size`` bounds the pages, not what they decode
to: dictionary encoding (which pyarrow's writer uses by default) stores a
repeated value once, so a 6 KB file can hold 400 copies of a 2 MiB string
(800 MB decoded), or a billion RLE-encoded zeros. So, before any value is
decoded, each column's decoded size is worked out and held to the bound:

- fixed-width values (numbers, bools, fixed-size lists and structs of
  them): rows x their widths, from the schema and the row groups' row counts;
- strings and binaries are read with their dictionaries kept
  (``read_dictionary``), and their decoded size is the sum of the lengths
  of the dictionary values each row points to; only then are they decoded;
- encodings whose pages do not bound what they decode to, and Arrow types
  that ``write_batch`` never writes (variable-size lists, maps ...), are
  refused.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marl_runner.io.batch_checks import BatchFileError

__all__ = ["leaf_count", "read_bounded"]

#: DELTA_BYTE_ARRAY stores each string as a prefix length into the previous one plus a
#: suffix: thousands of 2 MiB strings in a few bytes each. write_batch never uses it.
_UNBOUNDED_ENCODINGS = frozenset({"DELTA_BYTE_ARRAY"})


def read_bounded(
    parquet_file: pq.ParquetFile, file: BinaryIO, columns: list[str], path: Any, limit: int
) -> pa.Table:
    """``columns`` of ``parquet_file`` (opened on ``file``), refused with a BatchFileError
    naming ``path`` and the column if any would decode to more than ``limit`` bytes."""
    schema, metadata = parquet_file.schema_arrow, parquet_file.metadata
    rows = sum(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
    leaf_paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    leaf = 0
    fixed: dict[str, int] = {}
    variable: list[str] = []
    for arrow_field in schema:
        name, count = arrow_field.name, leaf_count(arrow_field.type)
        if name in columns:
            widths: list[tuple[int, bool]] = []
            _leaves(arrow_field.type, 1, widths, path, name)
            fixed[name] = sum(rows * per_row for per_row, _ in widths)
            variable += [leaf_paths[leaf + i] for i, (_, strings) in enumerate(widths) if strings]
            _check_encodings(metadata, range(leaf, leaf + count), path, name)
            _check(fixed[name], limit, path, name, "")
        leaf += count
    reader = pq.ParquetFile(file, metadata=metadata, read_dictionary=variable)
    table = reader.read(columns=columns, use_threads=False)
    for name in columns:
        strings = sum(_dictionary_bytes(chunk) for chunk in table.column(name).chunks)
        _check(fixed[name] + strings, limit, path, name, " (its strings and binaries decoded)")
    return table.cast(pa.schema([schema.field(name) for name in table.column_names]))


def leaf_count(arrow_type: pa.DataType) -> int:
    """Parquet leaf columns an Arrow type is stored as (structs: one per field, lists: their
    values')."""
    if pa.types.is_struct(arrow_type):
        return sum(leaf_count(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    ):
        return leaf_count(arrow_type.value_type)
    if pa.types.is_map(arrow_type):
        return leaf_count(arrow_type.key_type) + leaf_count(arrow_type.item_type)
    return 1


def _leaves(
    arrow_type: pa.DataType, per_row: int, out: list[tuple[int, bool]], path: Any, name: str
) -> None:
    """Appends, per Parquet leaf of ``arrow_type`` in order, its fixed bytes per row (offsets
    for strings) and whether it holds strings or binaries (``per_row``: values per row)."""
    if pa.types.is_struct(arrow_type):
        for i in range(arrow_type.num_fields):
            _leaves(arrow_type.field(i).type, per_row, out, path, name)
    elif pa.types.is_fixed_size_list(arrow_type):
        _leaves(arrow_type.value_type, per_row * arrow_type.list_size, out, path, name)
    elif (
        pa.types.is_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_large_binary(arrow_type)
    ):
        large = pa.types.is_large_string(arrow_type) or pa.types.is_large_binary(arrow_type)
        offset_bytes = 8 if large else 4
        out.append((per_row * offset_bytes, True))
    elif (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
        or pa.types.is_null(arrow_type)
    ):
        out.append((per_row * max(arrow_type.bit_width // 8, 1), False))
    else:
        raise BatchFileError(
            path,
            f"column {name!r} has Arrow type {arrow_type}, which write_batch never writes "
            "(and whose decoded size cannot be known before decoding it)",
        )


def _check_encodings(metadata: pq.FileMetaData, leaves: range, path: Any, name: str) -> None:
    for group in range(metadata.num_row_groups):
        for leaf in leaves:
            used = set(metadata.row_group(group).column(leaf).encodings) & _UNBOUNDED_ENCODINGS
            if used:
                raise BatchFileError(
                    path,
                    f"column {name!r} uses the encoding {sorted(used)[0]}, which write_batch "
                    "never uses (its decoded size cannot be known before decoding it)",
                )


def _dictionary_bytes(array: pa.Array) -> int:
    """Bytes the dictionary-encoded leaves of ``array`` take once decoded (values only)."""
    if isinstance(array, pa.DictionaryArray):
        lengths = pc.binary_length(array.dictionary).take(array.indices)
        return int(pc.sum(lengths).as_py() or 0)
    if pa.types.is_struct(array.type):
        return sum(_dictionary_bytes(array.field(i)) for i in range(array.type.num_fields))
    if pa.types.is_fixed_size_list(array.type):
        return _dictionary_bytes(array.flatten())
    if pa.types.is_string(array.type) or pa.types.is_binary(array.type):
        return int(pc.sum(pc.binary_length(array)).as_py() or 0)  # decoded already
    return 0


def _check(size: int, limit: int, path: Any, name: str, what: str) -> None:
    if size > limit:
        raise BatchFileError(
            path,
            f"column {name!r} would decode to {size:,} bytes{what}, more than the {limit:,} "
            "this file may decode to",
        )
