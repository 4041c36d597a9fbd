"""One binary format for trees of numpy arrays, shared by checkpoints and the policy server.

A frame is::

    magic                           8 bytes, names what the frame holds
    version                         uint32, little-endian
    header length                   uint64, little-endian
    header                          UTF-8 JSON object, with an "arrays" table
    array data                      the arrays' raw bytes, one after the other

A checkpoint file is a frame followed by its sha256 (``checkpoint/file_format``);
a request or answer body of ``marl-runner serve`` is a frame on its own
(``serving/codec``). In the header's values a numpy array is
``{"__ndarray__": i}`` (entry ``i`` of ``arrays``: dtype, shape, offset,
nbytes; numeric dtypes only), a tuple ``{"__tuple__": [...]}`` and a dict
with keys that are not all strings ``{"__items__": [[key, value], ...]}``.

Nothing read ever runs code (no pickle anywhere), and every field is checked
before anything is allocated: JSON at most 64 levels deep; each array entry a
numeric dtype, a shape of at most 32 non-negative ints whose product cannot
overflow, ``nbytes`` equal to that product, bytes inside the frame and no two
entries overlapping (so the arrays together are never larger than the frame);
and each array referenced exactly once, so no two values alias one array.
Every failure raises the caller's error class with a message naming the
field, prefixed by the caller's ``where`` (the file, or "request body").
"""

from __future__ import annotations

import functools
import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["decode_frame", "encode_frame", "pack", "unpack"]

_PREFIX = struct.Struct("<8sIQ")  # magic, version, header length
#: Array dtypes a frame may hold: numbers and booleans, never objects.
_ARRAY_KINDS = "biufc"
_TAGS = ("__ndarray__", "__tuple__", "__items__")
_TAG_SET = frozenset(_TAGS)
_PLAIN = (bool, int, float, str)  # stored as they are
_ARRAY_FIELDS = ("dtype", "shape", "offset", "nbytes")
_ARRAY_FIELD_SET = frozenset(_ARRAY_FIELDS)
_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")
MAX_DEPTH = 64  # JSON levels; real checkpoint headers need about 12
_MAX_NDIM = 32
_MAX_ARRAY_BYTES = 1 << 48  # any one array's declared extent; numpy's own limit is 2**63
PREFIX_BYTES = _PREFIX.size
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps makes one a call


def pack(value: Any, arrays: list[np.ndarray], where: Any, error: type[Exception]) -> Any:
    """The JSON-ready form of ``value``; its arrays are appended to ``arrays``.

    Takes None, bools, numbers, strings, lists, tuples, dicts and numeric numpy
    arrays (numpy scalars become numbers); anything else raises ``error``.
    ``where`` names ``value`` in messages (see ``_path``).
    """
    if value is None or isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise error(f"cannot write {_path(where)}: array dtype {value.dtype} is not numeric")
        arrays.append(value)
        return {"__ndarray__": len(arrays) - 1}
    if isinstance(value, np.generic):
        return pack(value.item(), arrays, where, error)
    if isinstance(value, tuple):
        return {"__tuple__": [pack(v, arrays, (where, "[{}]", i), error) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [pack(v, arrays, (where, "[{}]", i), error) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG_SET.isdisjoint(value):
            return {k: pack(v, arrays, (where, ".{}", k), error) for k, v in value.items()}
        return {
            "__items__": [
                [pack(k, arrays, where, error), pack(v, arrays, (where, "[{!r}]", k), error)]
                for k, v in value.items()
            ]
        }
    raise error(
        f"cannot write {_path(where)}: a {type(value).__name__} cannot be stored; expected "
        "numbers, strings, lists, tuples, dicts and numeric numpy arrays"
    )


def _path(where: Any) -> str:
    """A field's name for a message: ``where`` is a string, or ``(parent, template, key)``
    (the parent's name, then the template formatted with the key), so that the names of
    fields that pass are never built."""
    parts = []
    while isinstance(where, tuple):
        where, template, key = where
        parts.append(template.format(key))
    return where + "".join(reversed(parts))


def encode_frame(
    magic: bytes,
    version: int,
    header: dict[str, Any],
    arrays: list[np.ndarray],
    error: type[Exception],
) -> bytes:
    """A frame of ``header`` (its ``arrays`` table is added here) and the arrays' bytes."""
    table, offset = [], 0
    for array in arrays:
        table.append(
            {
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "offset": offset,
                "nbytes": array.nbytes,
            }
        )
        offset += array.nbytes
    try:
        header_bytes = _HEADER_JSON.encode({**header, "arrays": table}).encode()
    except (TypeError, ValueError) as err:
        raise error(f"cannot write {magic.decode(errors='replace')!r} frame: {err}") from None
    # tobytes() writes any array's elements in C order, contiguous or not.
    return b"".join(
        [_PREFIX.pack(magic, version, len(header_bytes)), header_bytes]
        + [array.tobytes() for array in arrays]
    )


def frame_version(data: bytes | memoryview) -> int:
    """The version field of a frame at least ``PREFIX_BYTES`` long (its magic checked apart)."""
    return _PREFIX.unpack_from(data)[1]


def decode_frame(
    data: bytes | memoryview,
    where: str,
    error: type[Exception],
    check_header: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """``(header, arrays)`` of a frame whose magic and version the caller has checked.

    The header is a JSON object, checked for depth, then by ``check_header``
    (the caller's own fields), then for an ``arrays`` list; the arrays are
    copies, allocated only after every entry passed its checks.
    """
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise error(f"{where} is truncated ({len(view)} bytes)")
    _, _, header_length = _PREFIX.unpack_from(view)
    header_end = _PREFIX.size + header_length
    if header_end > len(view):
        raise error(f"{where} header length {header_length} is past its end")
    header = parse_json(view[_PREFIX.size : header_end], f"{where} header", error)
    if not isinstance(header, dict):
        raise error(f"{where} header is a JSON {json_kind(header)}, expected an object")
    if check_header is not None:
        check_header(header)
    entries = header.get("arrays")
    if not isinstance(entries, list):
        raise error(
            f"{where} header field 'arrays' is a JSON {json_kind(entries)}, expected a JSON list"
        )
    return header, _read_arrays(entries, view[header_end:], where, error)


def parse_json(raw: bytes | memoryview, what: str, error: type[Exception]) -> Any:
    """JSON text at most ``MAX_DEPTH`` levels deep; ``what`` names it in errors."""
    too_deep = f"{what} is nested too deeply (expected at most {MAX_DEPTH} levels)"
    raw = bytes(raw)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise error(f"{what} is not valid JSON: {err}") from None
    except RecursionError:
        raise error(too_deep) from None
    # Later steps recurse over the value. Text with at most MAX_DEPTH brackets cannot nest
    # deeper (brackets inside strings only raise the count), so most bodies skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and depth_exceeds(value, MAX_DEPTH):
        raise error(too_deep)
    return value


def unpack(
    tree: Any, arrays: list[np.ndarray], where: str, error: type[Exception], path: str
) -> Any:
    """``tree`` (the value at field ``path``) with its tags resolved; each array must be
    referenced exactly once.

    Once, so that no two values alias one array and no array is stored
    without a use. ``where`` prefixes the field paths in errors.
    """
    used: list[Any] = [None] * len(arrays)  # where each array was referenced (see `_path`)

    def decode(value: Any, path: Any) -> Any:
        if isinstance(value, list):
            return [decode(v, (path, "[{}]", i)) for i, v in enumerate(value)]
        if not isinstance(value, dict):
            return value
        tag = next(iter(value)) if len(value) == 1 else None
        if tag not in _TAG_SET:
            return {k: decode(v, (path, ".{}", k)) for k, v in value.items()}
        inner = value[tag]
        if tag == "__ndarray__":
            if not _is_count(inner) or inner >= len(arrays):
                raise error(
                    f"{where} {_path(path)} refers to array {inner!r}; expected an index below "
                    f"{len(arrays)}"
                )
            if used[inner] is not None:
                raise error(
                    f"{where} {_path(used[inner])} and {_path(path)} both refer to array "
                    f"{inner}; expected each array to be referenced once"
                )
            used[inner] = path
            return arrays[inner]
        if not isinstance(inner, list):
            raise error(f"{where} {_path(path)}.{tag} is {short(inner)}; expected a list")
        if tag == "__tuple__":
            return tuple(decode(v, (path, "[{}]", i)) for i, v in enumerate(inner))
        out = {}
        for i, pair in enumerate(inner):
            at = f"{_path(path)}.__items__[{i}]"
            if not (isinstance(pair, list) and len(pair) == 2):
                raise error(f"{where} {at} is {short(pair)}; expected a [key, value] pair")
            key = decode(pair[0], f"{at}[0]")
            try:
                hash(key)  # a list, dict or array, or a tuple holding one
            except TypeError:
                raise error(
                    f"{where} {at}[0] is a {type(key).__name__} that cannot be hashed; "
                    "expected a hashable dict key"
                ) from None
            out[key] = decode(pair[1], f"{at}[1]")
        return out

    result = decode(tree, path)
    unused = [i for i, path in enumerate(used) if path is None]
    if unused:
        raise error(
            f"{where} arrays[{unused[0]}] is never referenced; expected each array to be "
            "referenced exactly once"
        )
    return result


def _read_arrays(
    entries: list[Any], blob: memoryview, where: str, error: type[Exception]
) -> list[np.ndarray]:
    """The arrays, after every entry is checked: nothing is allocated for a bad frame."""
    layout = [_array_entry(entry, i, len(blob), where, error) for i, entry in enumerate(entries)]
    by_offset = sorted((offset, nbytes, i) for i, (_, _, offset, nbytes) in enumerate(layout))
    end, previous = 0, None
    for offset, nbytes, i in by_offset:
        if not nbytes:  # an empty array occupies no bytes
            continue
        if offset < end:
            raise error(
                f"{where} field arrays[{i}] overlaps arrays[{previous}] (bytes "
                f"{offset}..{offset + nbytes} and ..{end}); expected each array in its own bytes"
            )
        end, previous = offset + nbytes, i
    return [
        np.frombuffer(blob, dtype, count=nbytes // dtype.itemsize, offset=offset)
        .reshape(shape)
        .copy()
        if nbytes
        else np.zeros(shape, dtype)
        for dtype, shape, offset, nbytes in layout
    ]


def _array_entry(
    entry: Any, i: int, data_bytes: int, where: str, error: type[Exception]
) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """``(dtype, shape, offset, nbytes)`` of entry ``i``, validated without allocating."""
    if not isinstance(entry, dict) or entry.keys() != _ARRAY_FIELD_SET:
        raise error(
            f"{_field(where, i)} is {short(entry)}; expected an object with exactly "
            f"{list(_ARRAY_FIELDS)}"
        )
    text = entry["dtype"]
    dtype = _dtype(text) if isinstance(text, str) else None
    if dtype is None:
        raise error(
            f"{_field(where, i)}.dtype is {short(text)}; expected a numeric dtype string such as "
            "'<f4'"
        )
    shape = entry["shape"]
    if not (
        isinstance(shape, list) and len(shape) <= _MAX_NDIM and all(_is_count(n) for n in shape)
    ):
        raise error(
            f"{_field(where, i)}.shape is {short(shape)}; expected a list of at most {_MAX_NDIM} "
            "integers >= 0"
        )
    size = math.prod(shape)
    if (size or math.prod(max(n, 1) for n in shape)) * dtype.itemsize > _MAX_ARRAY_BYTES:
        raise error(
            f"{_field(where, i)}.shape {shape} is too large for a {dtype} array (at most "
            f"{_MAX_ARRAY_BYTES} bytes, even counting zero-length axes as 1)"
        )
    offset, nbytes = entry["offset"], entry["nbytes"]
    for name, value in (("offset", offset), ("nbytes", nbytes)):
        if not _is_count(value):
            raise error(f"{_field(where, i)}.{name} is {short(value)}; expected an integer >= 0")
    if size * dtype.itemsize != nbytes:
        raise error(
            f"{_field(where, i)}: shape {shape} of {dtype} is {size * dtype.itemsize} bytes, "
            f"but nbytes is {nbytes}"
        )
    if offset + nbytes > data_bytes:
        raise error(
            f"{_field(where, i)}: bytes {offset}..{offset + nbytes} lie past the end of the array "
            f"data ({data_bytes} bytes)"
        )
    return dtype, tuple(shape), offset, nbytes


def _field(where: str, i: int) -> str:
    return f"{where} field arrays[{i}]"


@functools.lru_cache(maxsize=256)
def _dtype(text: str) -> np.dtype | None:
    """The numeric dtype a header names (``'<f4'``), or None; the few a frame uses are cached."""
    try:
        dtype = np.dtype(text) if _DTYPE.fullmatch(text) else None
    except TypeError:  # matches the pattern but is no dtype, e.g. 'i3'
        return None
    return dtype if dtype is not None and dtype.kind in _ARRAY_KINDS else None


def depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether JSON ``value`` nests deeper than ``max_depth`` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return False


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def json_kind(value: Any) -> str:
    """A JSON value's kind as JSON names it, for messages."""
    return {dict: "object", list: "list", str: "string"}.get(type(value), type(value).__name__)


def short(value: Any) -> str:
    """A JSON value for an error message, cut short: headers can be large."""
    text = repr(value)
    return f"the {json_kind(value)} {text if len(text) <= 60 else text[:57] + '...'}"
