"""The checkpoint file format: a checkpoint dict to bytes and back, every field checked.

Kept apart from ``marl_runner.checkpoint`` (which turns runners into these
dicts and back) so that reading a file is pure data handling: no torch, no
runner, no imports, nothing from the file executed.

Version 2 is a frame of ``marl_runner.io.array_tree`` (the format the policy
server's bodies use too; its docstring lists the checks every array entry
passes before anything is allocated) with magic ``b"MARLCKPT"``, followed by
a sha256 over everything before it::

    b"MARLCKPT" | version | header length | header | array data | sha256

The header holds ``format``, ``version``, ``config`` (``RunnerConfig.to_dict()``),
``policies`` and ``arrays``. ``policies`` is ``{policy_id: {"weights",
"agent_connectors", "action_connectors", "policy_state"}}`` (the runner's and
the policies' ``get_state()``), arrays and tuples tagged as ``array_tree``
tags them. Decoding checks the magic, the checksum, the version, then the
header's fields and their types, then the arrays and the policies' entries.
Anything else is a ``CheckpointError`` naming the file and the field.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from marl_runner.io.array_tree import (
    PREFIX_BYTES,
    decode_frame,
    encode_frame,
    frame_version,
    json_kind,
    pack,
    short,
    unpack,
)

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
_DIGEST_BYTES = 32
_PICKLE_OPCODE = b"\x80"  # what pickles of protocol 2+ (version-1 checkpoints) begin with
#: The header's fields and their JSON types.
_HEADER_FIELDS: dict[str, type] = {
    "format": str,
    "version": int,
    "config": dict,
    "policies": dict,
    "arrays": list,
}


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or that does not fit the runner built from it."""


def encode_checkpoint(payload: dict[str, Any], path: Path) -> bytes:
    """The file's bytes for a checkpoint dict; ``path`` only names the file in errors."""
    arrays: list[np.ndarray] = []
    policies = pack(payload["policies"], arrays, f"checkpoint {path}: policies", CheckpointError)
    header = {**payload, "policies": policies}
    body = encode_frame(_MAGIC, FORMAT_VERSION, header, arrays, CheckpointError)
    return body + hashlib.sha256(body).digest()


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
    if len(data) < PREFIX_BYTES + _DIGEST_BYTES:
        raise CheckpointError(f"{path}: checkpoint is truncated ({len(data)} bytes)")
    view = memoryview(data)  # slices of it copy nothing
    body, digest = view[:-_DIGEST_BYTES], view[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(
            f"{path}: checkpoint is corrupt: its sha256 checksum does not match its contents "
            "(truncated, or bytes changed after it was written)"
        )
    version = frame_version(body)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {version} is not supported "
            f"(this marl-runner reads version {FORMAT_VERSION})"
        )
    where = f"{path}: checkpoint"
    header, arrays = decode_frame(
        body, where, CheckpointError, check_header=lambda header: _check_header(header, path)
    )
    policies = unpack(header["policies"], arrays, f"{where} field", CheckpointError, "policies")
    if not isinstance(policies, dict):
        raise CheckpointError(
            f"{where} field policies is {short(header['policies'])}; expected an object of "
            "policy states"
        )
    _check_policies(policies, path)
    return {
        "format": header["format"],
        "version": header["version"],
        "config": header["config"],
        "policies": policies,
    }


def _check_header(header: dict[str, Any], path: Path) -> None:
    """The header's format, version, fields and their types."""
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
                f"{path}: checkpoint header field {key!r} is a JSON {json_kind(header[key])}, "
                f"expected a JSON {json_kind(kind())}"
            )
    unknown = sorted(set(header) - set(_HEADER_FIELDS))
    if unknown:
        raise CheckpointError(
            f"{path}: checkpoint header has unknown fields {unknown}; expected "
            f"{list(_HEADER_FIELDS)}"
        )


def _check_policies(policies: dict[str, Any], path: Path) -> None:
    """Each policy's entry has its state keys with the right kinds of values."""
    for pid, state in policies.items():
        where = f"{path}: checkpoint field policies.{pid}"
        if not isinstance(state, dict):
            raise CheckpointError(f"{where} is {short(state)}; expected an object")
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
                    f"{where}.{key} is {short(state[key])}; expected a list of connector states"
                )
        if not isinstance(state.get("policy_state", {}), dict):
            raise CheckpointError(
                f"{where}.policy_state is {short(state['policy_state'])}; expected an object"
            )
