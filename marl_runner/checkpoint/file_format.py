"""The checkpoint file format: a checkpoint dict to bytes and back, every field checked.

Kept apart from ``marl_runner.checkpoint`` (which turns runners into these
dicts and back) so that reading a file is pure data handling: no torch, no
runner, no imports, nothing from the file executed.

Version 2, designed so that loading never runs code from the file (no pickle
anywhere) and any corruption is caught before use::

    b"MARLCKPT"                     8 bytes, magic
    version                         uint32, little-endian
    header length                   uint64, little-endian
    header                          UTF-8 JSON: format, version, config
                                    (RunnerConfig.to_dict()), policies, arrays
    array data                      the arrays' raw bytes, one after the other
    sha256                          32 bytes, over everything before it

``policies`` is ``{policy_id: {"weights", "agent_connectors",
"action_connectors", "policy_state"}}`` (the runner's and the policies'
``get_state()``) as JSON, with numpy arrays replaced by ``{"__ndarray__": i}``
(entry i of ``arrays``: dtype, shape, offset, nbytes; numeric dtypes only),
tuples by ``{"__tuple__": [...]}`` and dicts with non-string keys by
``{"__items__": [[key, value], ...]}``. Decoding checks the magic, the
checksum, the version, then the header (JSON at most 64 levels deep, every
field and its type), then every array entry before any array is allocated:
a numeric dtype, a shape of at most 32 non-negative ints whose product cannot
overflow, ``nbytes`` equal to that product, bytes inside the file and no two
entries overlapping (so the arrays together are never larger than the file),
and each array referenced exactly once. Anything else is a
``CheckpointError`` naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "STATE_KEYS",
    "CheckpointError",
    "decode_checkpoint",
    "encode_checkpoint",
]

FORMAT_NAME = "marl-runner-checkpoint"
FORMAT_VERSION = 2
#: What every policy entry holds besides the optional ``policy_state``.
STATE_KEYS = ("weights", "agent_connectors", "action_connectors")
_MAGIC = b"MARLCKPT"
_PREFIX = struct.Struct("<8sIQ")  # magic, version, header length
_DIGEST_BYTES = 32
_PICKLE_OPCODE = b"\x80"  # what pickles of protocol 2+ (version-1 checkpoints) begin with
#: Array dtypes a checkpoint may hold: numbers and booleans, never objects.
_ARRAY_KINDS = "biufc"
_TAGS = ("__ndarray__", "__tuple__", "__items__")
#: The header's fields and their JSON types.
_HEADER_FIELDS: dict[str, type] = {
    "format": str,
    "version": int,
    "config": dict,
    "policies": dict,
    "arrays": list,
}
_ARRAY_FIELDS = ("dtype", "shape", "offset", "nbytes")
_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")
_MAX_DEPTH = 64  # JSON levels; real headers need about 12
_MAX_NDIM = 32
_MAX_ARRAY_BYTES = 1 << 48  # any one array's declared extent; numpy's own limit is 2**63


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or that does not fit the runner built from it."""


def encode_checkpoint(payload: dict[str, Any], path: Path) -> bytes:
    """The file's bytes for a checkpoint dict; ``path`` only names the file in errors."""
    arrays: list[np.ndarray] = []
    header = {**payload, "policies": _encode(payload["policies"], arrays, "policies")}
    header["arrays"] = []
    offset = 0
    for array in arrays:
        header["arrays"].append(
            {
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "offset": offset,
                "nbytes": array.nbytes,
            }
        )
        offset += array.nbytes
    try:
        header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"cannot write checkpoint {path}: {err}") from None
    body = b"".join(
        [_PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header_bytes)), header_bytes]
        + [np.ascontiguousarray(array).tobytes() for array in arrays]
    )
    return body + hashlib.sha256(body).digest()


def _encode(value: Any, arrays: list[np.ndarray], where: str) -> Any:
    """JSON-ready form of a state tree; arrays go to ``arrays`` (see the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise CheckpointError(f"cannot save {where}: array dtype {value.dtype} is not numeric")
        arrays.append(value)
        return {"__ndarray__": len(arrays) - 1}
    if isinstance(value, np.generic):
        return _encode(value.item(), arrays, where)
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k in _TAGS for k in value):
            return {k: _encode(v, arrays, f"{where}.{k}") for k, v in value.items()}
        return {
            "__items__": [
                [_encode(k, arrays, where), _encode(v, arrays, f"{where}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    raise CheckpointError(
        f"cannot save {where}: a {type(value).__name__} is not checkpointable; expected "
        "numbers, strings, lists, tuples, dicts and numeric numpy arrays"
    )


def decode_checkpoint(data: bytes, path: Path) -> dict[str, Any]:
    """The checkpoint dict in a file's bytes, every check in the module docstring passed.

    Raises:
        CheckpointError: naming ``path`` and the first field that is wrong.
    """
    if not data.startswith(_MAGIC):
        if data.startswith(_PICKLE_OPCODE):
            raise CheckpointError(
                f"{path} is a pickle (a version-1 marl-runner checkpoint or something else); "
                "it is not loaded, because unpickling can run code from the file"
            )
        raise CheckpointError(f"{path} is not a marl-runner checkpoint (no {_MAGIC!r} magic)")
    if len(data) < _PREFIX.size + _DIGEST_BYTES:
        raise CheckpointError(f"{path}: checkpoint is truncated ({len(data)} bytes)")
    view = memoryview(data)  # slices of it copy nothing
    body, digest = view[:-_DIGEST_BYTES], view[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(
            f"{path}: checkpoint is corrupt: its sha256 checksum does not match its contents "
            "(truncated, or bytes changed after it was written)"
        )
    _, version, header_length = _PREFIX.unpack_from(body)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {version} is not supported "
            f"(this marl-runner reads version {FORMAT_VERSION})"
        )
    header_end = _PREFIX.size + header_length
    if header_end > len(body):
        raise CheckpointError(f"{path}: checkpoint header length {header_length} is past its end")
    header = _parse_header(body[_PREFIX.size : header_end], path)
    arrays = _read_arrays(header["arrays"], body[header_end:], path)
    policies = _decode_policies(header["policies"], arrays, path)
    _check_policies(policies, path)
    return {
        "format": header["format"],
        "version": header["version"],
        "config": header["config"],
        "policies": policies,
    }


def _parse_header(raw: memoryview, path: Path) -> dict[str, Any]:
    """The header's JSON, checked for depth, keys and their types; never a partial object."""
    too_deep = (
        f"{path}: checkpoint header is nested too deeply (expected at most {_MAX_DEPTH} levels)"
    )
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: checkpoint header is not valid JSON: {err}") from None
    except RecursionError:
        raise CheckpointError(too_deep) from None
    if _depth_exceeds(header, _MAX_DEPTH):  # later steps recurse over the header
        raise CheckpointError(too_deep)
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{path}: checkpoint header is a JSON {type(header).__name__}, expected an object"
        )
    if header.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{path} is not a marl-runner checkpoint: header field 'format' is "
            f"{header.get('format')!r}, expected {FORMAT_NAME!r}"
        )
    if header.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint header version {header.get('version')!r} is not supported "
            f"(this marl-runner reads version {FORMAT_VERSION})"
        )
    for key, kind in _HEADER_FIELDS.items():
        if key not in header:
            raise CheckpointError(f"{path}: checkpoint header has no {key!r} field")
        if not isinstance(header[key], kind):
            raise CheckpointError(
                f"{path}: checkpoint header field {key!r} is a JSON {_json_kind(header[key])}, "
                f"expected a JSON {_json_kind(kind())}"
            )
    unknown = sorted(set(header) - set(_HEADER_FIELDS))
    if unknown:
        raise CheckpointError(
            f"{path}: checkpoint header has unknown fields {unknown}; expected "
            f"{list(_HEADER_FIELDS)}"
        )
    return header


def _depth_exceeds(value: Any, max_depth: int) -> bool:
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


def _read_arrays(entries: list[Any], blob: memoryview, path: Path) -> list[np.ndarray]:
    """The arrays, after every entry is checked: nothing is allocated for a bad file."""
    layout = [_array_entry(entry, i, len(blob), path) for i, entry in enumerate(entries)]
    by_offset = sorted((offset, nbytes, i) for i, (_, _, offset, nbytes) in enumerate(layout))
    end, previous = 0, None
    for offset, nbytes, i in by_offset:
        if not nbytes:  # an empty array occupies no bytes
            continue
        if offset < end:
            raise CheckpointError(
                f"{path}: checkpoint field arrays[{i}] overlaps arrays[{previous}] (bytes "
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
    entry: Any, i: int, data_bytes: int, path: Path
) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """``(dtype, shape, offset, nbytes)`` of entry ``i``, validated without allocating."""
    where = f"{path}: checkpoint field arrays[{i}]"
    if not isinstance(entry, dict) or set(entry) != set(_ARRAY_FIELDS):
        raise CheckpointError(
            f"{where} is {_short(entry)}; expected an object with exactly {list(_ARRAY_FIELDS)}"
        )
    text = entry["dtype"]
    try:
        dtype = np.dtype(text) if isinstance(text, str) and _DTYPE.fullmatch(text) else None
    except TypeError:  # matches the pattern but is no dtype, e.g. 'i3'
        dtype = None
    if dtype is None or dtype.kind not in _ARRAY_KINDS:
        raise CheckpointError(
            f"{where}.dtype is {_short(text)}; expected a numeric dtype string such as '<f4'"
        )
    shape = entry["shape"]
    if not (
        isinstance(shape, list) and len(shape) <= _MAX_NDIM and all(_is_count(n) for n in shape)
    ):
        raise CheckpointError(
            f"{where}.shape is {_short(shape)}; expected a list of at most {_MAX_NDIM} "
            "integers >= 0"
        )
    if math.prod(max(n, 1) for n in shape) * dtype.itemsize > _MAX_ARRAY_BYTES:
        raise CheckpointError(
            f"{where}.shape {shape} is too large for a {dtype} array (at most "
            f"{_MAX_ARRAY_BYTES} bytes, even counting zero-length axes as 1)"
        )
    for field in ("offset", "nbytes"):
        if not _is_count(entry[field]):
            raise CheckpointError(
                f"{where}.{field} is {_short(entry[field])}; expected an integer >= 0"
            )
    offset, nbytes = entry["offset"], entry["nbytes"]
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise CheckpointError(
            f"{where}: shape {shape} of {dtype} is {math.prod(shape) * dtype.itemsize} bytes, "
            f"but nbytes is {nbytes}"
        )
    if offset + nbytes > data_bytes:
        raise CheckpointError(
            f"{where}: bytes {offset}..{offset + nbytes} lie past the end of the array data "
            f"({data_bytes} bytes)"
        )
    return dtype, tuple(shape), offset, nbytes


def _decode_policies(tree: dict[str, Any], arrays: list[np.ndarray], path: Path) -> dict[str, Any]:
    """The header's ``policies`` with tags resolved, each array referenced exactly once.

    Once, so that no two state entries alias one array and no array is
    stored without a use.
    """
    used: list[str | None] = [None] * len(arrays)  # where each array was referenced

    def decode(value: Any, where: str) -> Any:
        if isinstance(value, list):
            return [decode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, dict):
            return value
        tag = next(iter(value)) if len(value) == 1 else None
        if tag not in _TAGS:
            return {k: decode(v, f"{where}.{k}") for k, v in value.items()}
        inner = value[tag]
        if tag == "__ndarray__":
            if not _is_count(inner) or inner >= len(arrays):
                raise CheckpointError(
                    f"{path}: checkpoint field {where} refers to array {inner!r}; expected an "
                    f"index below {len(arrays)}"
                )
            if used[inner] is not None:
                raise CheckpointError(
                    f"{path}: checkpoint fields {used[inner]} and {where} both refer to array "
                    f"{inner}; expected each array to be referenced once"
                )
            used[inner] = where
            return arrays[inner]
        if not isinstance(inner, list):
            raise CheckpointError(
                f"{path}: checkpoint field {where}.{tag} is {_short(inner)}; expected a list"
            )
        if tag == "__tuple__":
            return tuple(decode(v, f"{where}[{i}]") for i, v in enumerate(inner))
        out = {}
        for i, pair in enumerate(inner):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise CheckpointError(
                    f"{path}: checkpoint field {where}.__items__[{i}] is {_short(pair)}; "
                    "expected a [key, value] pair"
                )
            key = decode(pair[0], f"{where}.__items__[{i}][0]")
            if isinstance(key, list | dict | np.ndarray):
                raise CheckpointError(
                    f"{path}: checkpoint field {where}.__items__[{i}][0] is a "
                    f"{type(key).__name__}; expected a hashable dict key"
                )
            out[key] = decode(pair[1], f"{where}.__items__[{i}][1]")
        return out

    policies = decode(tree, "policies")
    if not isinstance(policies, dict):
        raise CheckpointError(
            f"{path}: checkpoint field policies is {_short(tree)}; expected an object of "
            "policy states"
        )
    unused = [i for i, where in enumerate(used) if where is None]
    if unused:
        raise CheckpointError(
            f"{path}: checkpoint field arrays[{unused[0]}] is never referenced; expected each "
            "array to be referenced exactly once"
        )
    return policies


def _check_policies(policies: dict[str, Any], path: Path) -> None:
    """Each policy's entry has its state keys with the right kinds of values."""
    for pid, state in policies.items():
        where = f"{path}: checkpoint field policies.{pid}"
        if not isinstance(state, dict):
            raise CheckpointError(f"{where} is {_short(state)}; expected an object")
        for key in STATE_KEYS:
            if key not in state:
                raise CheckpointError(f"{where} has no {key!r}")
        unknown = sorted(set(state) - {*STATE_KEYS, "policy_state"})
        if unknown:
            raise CheckpointError(
                f"{where} has unknown fields {unknown}; expected {[*STATE_KEYS, 'policy_state']}"
            )
        for key in ("agent_connectors", "action_connectors"):
            if not isinstance(state[key], list):
                raise CheckpointError(
                    f"{where}.{key} is {_short(state[key])}; expected a list of connector states"
                )
        if not isinstance(state.get("policy_state", {}), dict):
            raise CheckpointError(
                f"{where}.policy_state is {_short(state['policy_state'])}; expected an object"
            )


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    """A JSON value for an error message, cut short: headers can be large."""
    text = repr(value)
    return f"the {_json_kind(value)} {text if len(text) <= 60 else text[:57] + '...'}"
