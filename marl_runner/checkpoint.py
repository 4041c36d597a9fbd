"""Saving a runner to one file and building an equal runner from it.

A checkpoint holds what is needed to go on sampling where a runner left off,
policy-wise: the runner config (``config.to_dict()``), and per policy its
weights, its agent and action connector chains with their state (e.g. the
observation filter statistics) and the policy's own state (e.g. the seeded
sampling generator, so a restored policy draws the same actions).

What it does NOT hold: running episodes (a restored runner starts fresh
episodes; env RNGs start from the config's ``seed``), and anything that is
not part of the config: ready-made ``Policy`` objects, a callable policy
mapping fn or a ``Callbacks`` instance given to ``EnvRunner`` directly. Pass
those again to ``restore_checkpoint`` (``**runner_kwargs``); the weights
and connector state of such policies are still restored from the file.

File format (version 2), designed so that loading never runs code from the
file (no pickle anywhere) and any corruption is caught before use::

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
``{"__items__": [[key, value], ...]}``. Restoring checks the magic, then the
checksum, then the version, then every array entry, and raises
``CheckpointError`` naming the file and what is wrong.

It is written atomically: to a hidden temp file in the target's directory,
flushed and fsynced, then renamed over the target (``os.replace``), so a
reader sees the old checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from marl_runner.config import RunnerConfig
from marl_runner.sampling.runner import EnvRunner

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointError",
    "load_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
    "write_checkpoint",
]

FORMAT_NAME = "marl-runner-checkpoint"
FORMAT_VERSION = 2
_MAGIC = b"MARLCKPT"
_PREFIX = struct.Struct("<8sIQ")  # magic, version, header length
_DIGEST_BYTES = 32
_PICKLE_START = (b"\x80",)  # pickle protocol 2+ opcode: what version-1 checkpoints begin with
#: Array dtypes a checkpoint may hold: numbers and booleans, never objects.
_ARRAY_KINDS = "biufc"
_TAGS = ("__ndarray__", "__tuple__", "__items__")
_STATE_KEYS = ("weights", "agent_connectors", "action_connectors")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or that does not fit the runner built from it."""


def save_checkpoint(runner: EnvRunner, path: str | os.PathLike[str]) -> Path:
    """Writes ``runner``'s config, weights and connector state to ``path`` atomically.

    Creates the parent directory if needed and replaces an existing file.
    Returns the path written.
    """
    path = Path(path)
    policies: dict[str, dict[str, Any]] = {}
    policy_map = runner.policy_map
    for policy_id, state in runner.get_state().items():
        entry = {key: state[key] for key in _STATE_KEYS if key in state}
        policy = policy_map.get(policy_id)
        if policy is not None:
            entry["policy_state"] = policy.get_state()
        policies[policy_id] = entry
    payload = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "config": runner.config.to_dict(),
        "policies": policies,
    }
    return write_checkpoint(payload, path)


def write_checkpoint(payload: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Writes a checkpoint dict (as ``load_checkpoint`` returns it) to ``path`` atomically."""
    path = Path(path)
    data = _encode_file(payload, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            tmp_file.write(data)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's dict (see the module docstring), verified: magic, checksum,
    version, arrays. Never runs code from the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    return _decode_file(data, path)


def _encode_file(payload: dict[str, Any], path: Path) -> bytes:
    arrays: list[np.ndarray] = []
    header = {
        key: _encode(value, arrays, key) if key == "policies" else value
        for key, value in payload.items()
    }
    entries = []
    offset = 0
    for array in arrays:
        entries.append(
            {
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "offset": offset,
                "nbytes": array.nbytes,
            }
        )
        offset += array.nbytes
    header["arrays"] = entries
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
    """JSON-ready form of a state tree; arrays go to `arrays` (see the module docstring)."""
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


def _decode_file(data: bytes, path: Path) -> dict[str, Any]:
    if not data.startswith(_MAGIC):
        if data.startswith(_PICKLE_START):
            raise CheckpointError(
                f"{path} is a pickle (a version-1 marl-runner checkpoint or something else); "
                "it is not loaded, because unpickling can run code from the file"
            )
        raise CheckpointError(f"{path} is not a marl-runner checkpoint (no {_MAGIC!r} magic)")
    if len(data) < _PREFIX.size + _DIGEST_BYTES:
        raise CheckpointError(f"{path}: checkpoint is truncated ({len(data)} bytes)")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
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
    try:
        header = json.loads(body[_PREFIX.size : header_end].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: checkpoint header is not valid JSON: {err}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{path} is not a marl-runner checkpoint (expected format {FORMAT_NAME!r})"
        )
    if header.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint header version {header.get('version')!r} is not supported "
            f"(this marl-runner reads version {FORMAT_VERSION})"
        )
    arrays = _read_arrays(header.get("arrays"), body[header_end:], path)
    for key in ("config", "policies"):
        if not isinstance(header.get(key), dict):
            raise CheckpointError(f"{path}: checkpoint has no {key!r} dict")
    payload = {key: value for key, value in header.items() if key != "arrays"}
    payload["policies"] = _decode(header["policies"], arrays, path)
    return payload


def _read_arrays(entries: Any, blob: bytes, path: Path) -> list[np.ndarray]:
    if not isinstance(entries, list):
        raise CheckpointError(f"{path}: checkpoint has no 'arrays' list")
    arrays = []
    for i, entry in enumerate(entries):
        try:
            dtype = np.dtype(entry["dtype"])
            shape = tuple(int(n) for n in entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        except (TypeError, KeyError, ValueError) as err:
            raise CheckpointError(f"{path}: checkpoint array {i} is malformed ({err!r})") from None
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject:
            raise CheckpointError(
                f"{path}: checkpoint array {i} has dtype {dtype}; expected a number type"
            )
        if any(n < 0 for n in shape) or nbytes != int(np.prod(shape)) * dtype.itemsize:
            raise CheckpointError(
                f"{path}: checkpoint array {i}: shape {shape} does not fit {nbytes} bytes"
            )
        if offset < 0 or offset + nbytes > len(blob):
            raise CheckpointError(f"{path}: checkpoint array {i} lies past the end of the data")
        arrays.append(
            np.frombuffer(blob, dtype, count=nbytes // max(dtype.itemsize, 1), offset=offset)
            .reshape(shape)
            .copy()
        )
    return arrays


def _decode(value: Any, arrays: list[np.ndarray], path: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays, path) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "__ndarray__":
            if not isinstance(inner, int) or not 0 <= inner < len(arrays):
                raise CheckpointError(f"{path}: checkpoint refers to a missing array {inner!r}")
            return arrays[inner]
        if tag == "__tuple__" and isinstance(inner, list):
            return tuple(_decode(v, arrays, path) for v in inner)
        if tag == "__items__" and isinstance(inner, list):
            try:
                return {
                    _hashable(_decode(k, arrays, path)): _decode(v, arrays, path) for k, v in inner
                }
            except (TypeError, ValueError) as err:
                raise CheckpointError(f"{path}: checkpoint has a malformed dict ({err})") from None
    return {k: _decode(v, arrays, path) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    if isinstance(key, list | dict | np.ndarray):
        raise TypeError(f"unhashable key {type(key).__name__}")
    return key


def restore_checkpoint(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] | None = None,
    runner_cls: type[EnvRunner] | None = None,
    **runner_kwargs: Any,
) -> EnvRunner:
    """A new ``EnvRunner`` built from the checkpoint's config, with its weights and connector state.

    ``overrides`` are ``"dotted.key=value"`` config overrides applied before
    the runner is built (e.g. ``["num_envs=16"]``); ``runner_kwargs`` go to
    ``EnvRunner`` (``policies``, ``policy_mapping_fn``, ``callbacks``), for
    what the config cannot hold. ``runner_cls`` builds a subclass instead.

    Raises:
        CheckpointError: unreadable or corrupt file (checksum), unknown
            format or version, or a checkpointed policy the restored runner
            does not have.
    """

    payload = load_checkpoint(path)
    try:
        config = RunnerConfig.from_dict(payload["config"])
    except ValueError as err:
        raise CheckpointError(f"{path}: checkpoint config is not valid: {err}") from None
    if overrides:
        config = config.with_overrides(overrides)
    runner = (runner_cls or EnvRunner)(config, **runner_kwargs)
    try:
        _apply_state(runner, payload["policies"], path)
    except BaseException:
        runner.stop()
        raise
    return runner


def _apply_state(runner: EnvRunner, policies: dict[str, Any], path: Any) -> None:
    policy_map = runner.policy_map
    missing = sorted(set(policies) - set(policy_map))
    if missing:
        raise CheckpointError(
            f"{path}: the restored runner has no policies {missing} (it has "
            f"{sorted(policy_map)}); policies added with add_policy() or built only when "
            "their first agent appears must be passed as policies= to restore them"
        )
    try:
        runner.set_state(
            {pid: {key: state[key] for key in _STATE_KEYS} for pid, state in policies.items()}
        )
        for pid, state in policies.items():
            if "policy_state" in state:
                policy_map[pid].set_state(state["policy_state"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise CheckpointError(
            f"{path}: checkpoint state does not fit the restored runner: {type(err).__name__}: {err}"
        ) from None


def _fsync_dir(directory: Path) -> None:
    """Makes the rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
