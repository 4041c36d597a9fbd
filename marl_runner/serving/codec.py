"""Request/response bodies: the project's binary array format, or plain JSON. Never pickle.

A binary body (`application/x-marl-runner`) is a frame of
`marl_runner.io.array_tree`, the format checkpoints use, with magic
``b"MARLBODY"``: arrays come back with their dtype and shape, tuples as
tuples, dicts keep integer keys; everything is checked before anything is
allocated. A JSON body carries arrays as nested lists, for clients in other
languages. A malformed body raises `CodecError` (a `ValueError`: 400).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from marl_runner.io.array_tree import (
    PREFIX_BYTES,
    decode_frame,
    encode_frame,
    frame_version,
    pack,
    unpack,
)

BINARY = "application/x-marl-runner"
JSON = "application/json"
CONTENT_TYPES = (BINARY, JSON)

_MAGIC = b"MARLBODY"
_VERSION = 1
_ALLOWED_KINDS = frozenset("biufc")  # bool, ints, unsigned, floats, complex: never objects


class CodecError(ValueError):
    """A body that is not a well-formed message of the expected codec."""


def encode(value: Any, content_type: str = BINARY) -> bytes:
    """`value` (dicts, lists, tuples, numbers, strings, None, numpy arrays) as a body."""
    if content_type == BINARY and type(value) is dict and not value:
        return _EMPTY_OBJECT
    if content_type == JSON:
        return json.dumps(_to_json(value), allow_nan=True).encode("utf-8")
    if content_type != BINARY:
        raise CodecError(f"content type {content_type!r}: expected one of {list(CONTENT_TYPES)}")
    arrays: list[np.ndarray] = []
    tree = pack(value, arrays, "body", CodecError)
    return encode_frame(_MAGIC, _VERSION, {"tree": tree}, arrays, CodecError)


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
    if body == _EMPTY_OBJECT:  # the answer of every call that returns nothing
        return {}
    if len(body) < PREFIX_BYTES or not body.startswith(_MAGIC):
        raise CodecError(
            f"body does not start with the {_MAGIC!r} marker of {BINARY}; "
            "(pickled or other payloads are refused)"
        )
    if frame_version(body) != _VERSION:
        raise CodecError(f"body format version {frame_version(body)}: expected {_VERSION}")
    header, arrays = decode_frame(body, "body", CodecError, check_header=_check_header)
    return unpack(header["tree"], arrays, "body field", CodecError, "tree")


# `{}` as a body, made once: most answers are this (log_returns, log_action, end_episode).
_EMPTY_OBJECT = encode_frame(_MAGIC, _VERSION, {"tree": {}}, [], CodecError)


def json_text(body: bytes | bytearray) -> str:
    """A JSON body as text, so the caller can drop the bytes before the (bigger) parse."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError(f"body is not valid JSON: {exc}") from None


def _check_header(header: dict[str, Any]) -> None:
    if set(header) != {"tree", "arrays"}:
        raise CodecError(
            f"body header has keys {sorted(header)!r}; expected exactly 'tree' and 'arrays'"
        )


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
