"""Request/response bodies: a safe binary framing for numpy arrays, or plain JSON.

Nothing here ever unpickles: a body is JSON plus raw array bytes, and arrays
are rebuilt with `np.frombuffer` from an allow-listed numeric dtype and a
shape that must match the bytes. A malformed or hostile body raises
`CodecError` (a `ValueError`), which the server answers with a 400.

Binary body (`application/x-marl-runner`)::

    b"MRB1" | uint32 LE header length | UTF-8 JSON header | array bytes

The header is `{"tree": T, "arrays": [[dtype, shape, offset, nbytes], ...]}`.
In `T`, a dict whose only key starts with NUL is a tag: `{"\\u0000a": i}` is
array `i`, `{"\\u0000d": [[key, value], ...]}` a dict with non-string keys
(integer agent ids survive). Tuples travel as lists, numpy scalars as numbers.

JSON body (`application/json`): the same values with arrays as nested lists,
for clients in other languages; the server converts observations and actions
to their spaces' dtypes.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

BINARY = "application/x-marl-runner"
JSON = "application/json"
CONTENT_TYPES = (BINARY, JSON)

_MAGIC = b"MRB1"
_HEADER_LEN = struct.Struct("<I")
_ARRAY_TAG = "\x00a"
_DICT_TAG = "\x00d"
_ALLOWED_KINDS = frozenset("biufc")  # bool, ints, unsigned, floats, complex: never objects
_MAX_DIMS = 32


class CodecError(ValueError):
    """A body that is not a well-formed message of the expected codec."""


def encode(value: Any, content_type: str = BINARY) -> bytes:
    """`value` (dicts, lists, numbers, strings, None, numpy arrays) as a body."""
    if content_type == JSON:
        return json.dumps(_to_json(value), allow_nan=True).encode("utf-8")
    if content_type != BINARY:
        raise CodecError(f"content type {content_type!r}: expected one of {list(CONTENT_TYPES)}")
    arrays: list[np.ndarray] = []
    tree = _tag(value, arrays)
    descriptors = []
    offset = 0
    for array in arrays:
        descriptors.append([array.dtype.str, list(array.shape), offset, array.nbytes])
        offset += array.nbytes
    header = json.dumps({"tree": tree, "arrays": descriptors}).encode("utf-8")
    return b"".join([_MAGIC, _HEADER_LEN.pack(len(header)), header, *(a.tobytes() for a in arrays)])


def decode(body: bytes | bytearray | str, content_type: str = BINARY) -> Any:
    """The value a body carries; raises `CodecError` on anything malformed.

    A JSON body may come as text already (`json_text`).
    """
    if content_type == JSON:
        text = body if isinstance(body, str) else json_text(body)
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CodecError(f"body is not valid JSON: {exc}") from None
    if isinstance(body, str):
        raise CodecError(f"a {BINARY} body must be bytes, got text")
    if content_type != BINARY:
        raise CodecError(f"content type {content_type!r}: expected one of {list(CONTENT_TYPES)}")
    if len(body) < len(_MAGIC) + _HEADER_LEN.size or not body.startswith(_MAGIC):
        raise CodecError(
            f"body does not start with the {_MAGIC!r} marker of {BINARY}; "
            "(pickled or other payloads are refused)"
        )
    (header_len,) = _HEADER_LEN.unpack_from(body, len(_MAGIC))
    start = len(_MAGIC) + _HEADER_LEN.size
    if start + header_len > len(body):
        raise CodecError(f"header length {header_len} runs past the end of a {len(body)}-byte body")
    try:
        header = json.loads(body[start : start + header_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CodecError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"tree", "arrays"}:
        raise CodecError("header must be an object with exactly the keys 'tree' and 'arrays'")
    data = memoryview(body)[start + header_len :]
    arrays = [_array(d, data, i) for i, d in enumerate(_list(header["arrays"], "arrays"))]
    try:
        return _untag(header["tree"], arrays)
    except RecursionError:
        raise CodecError("body nests too deeply") from None


def json_text(body: bytes | bytearray) -> str:
    """A JSON body as text, so the caller can drop the bytes before the (bigger) parse."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError(f"body is not valid JSON: {exc}") from None


# ----------------------------------------------------------------------------- encoding


def _tag(value: Any, arrays: list[np.ndarray]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ALLOWED_KINDS:
            raise CodecError(f"cannot send an array of dtype {value.dtype}: numeric arrays only")
        arrays.append(np.ascontiguousarray(value))
        return {_ARRAY_TAG: len(arrays) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("\x00") for k in value):
            return {k: _tag(v, arrays) for k, v in value.items()}
        return {_DICT_TAG: [[_key(k), _tag(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_tag(v, arrays) for v in value]
    raise CodecError(f"cannot send a {type(value).__name__}: expected numbers, strings, "
                     "lists, dicts or numeric numpy arrays")


def _key(key: Any) -> Any:
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return key
    if isinstance(key, np.integer):
        return int(key)
    raise CodecError(f"dict key {key!r}: expected a str or int")


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ALLOWED_KINDS:
            raise CodecError(f"cannot send an array of dtype {value.dtype}: numeric arrays only")
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CodecError(f"cannot send a {type(value).__name__} as JSON")


# ----------------------------------------------------------------------------- decoding


def _array(descriptor: Any, data: memoryview, index: int) -> np.ndarray:
    where = f"arrays[{index}]"
    if not isinstance(descriptor, list) or len(descriptor) != 4:
        raise CodecError(f"{where}: expected [dtype, shape, offset, nbytes]")
    dtype_str, shape, offset, nbytes = descriptor
    if not isinstance(dtype_str, str) or len(dtype_str) > 8:
        raise CodecError(f"{where}: dtype {dtype_str!r} is not a numeric dtype string")
    try:
        dtype = np.dtype(dtype_str)
    except TypeError:
        raise CodecError(f"{where}: dtype {dtype_str!r} is not a numpy dtype") from None
    if dtype.kind not in _ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CodecError(f"{where}: dtype {dtype_str!r} refused; numeric dtypes only")
    shape = _list(shape, f"{where} shape")
    if len(shape) > _MAX_DIMS or not all(_count(n) for n in shape):
        raise CodecError(f"{where}: shape {shape!r} must be at most {_MAX_DIMS} ints >= 0")
    if not (_count(offset) and _count(nbytes)) or offset + nbytes > len(data):
        raise CodecError(f"{where}: bytes [{offset}, {offset}+{nbytes}) run past the body")
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise CodecError(f"{where}: shape {shape} of {dtype} needs {math.prod(shape) * dtype.itemsize} "
                         f"bytes, the body has {nbytes}")
    return np.frombuffer(data[offset : offset + nbytes], dtype=dtype).reshape(shape).copy()


def _untag(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_untag(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    tags = [k for k in value if k.startswith("\x00")]
    if not tags:
        return {k: _untag(v, arrays) for k, v in value.items()}
    if len(value) != 1:
        raise CodecError(f"a tagged object must have one key, got {sorted(value)!r}")
    if _ARRAY_TAG in value:
        index = value[_ARRAY_TAG]
        if not _count(index) or index >= len(arrays):
            raise CodecError(f"array reference {index!r}: the body has {len(arrays)} arrays")
        return arrays[index]
    if _DICT_TAG in value:
        out = {}
        for pair in _list(value[_DICT_TAG], "dict items"):
            if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], (str, int)):
                raise CodecError("dict items must be [key, value] pairs with str or int keys")
            out[pair[0]] = _untag(pair[1], arrays)
        return out
    raise CodecError(f"unknown tag {tags[0]!r}")


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise CodecError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
