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
``{"__items__": [[key, value], ...]}``. Loading checks the magic, the
checksum, the version, then the header (JSON at most 64 levels deep, every
field and its type), then every array entry before any array is allocated:
a numeric dtype, a shape of at most 32 non-negative ints whose product cannot
overflow, ``nbytes`` equal to that product, bytes inside the file and no two
entries overlapping (so the arrays together are never larger than the file),
and each array referenced exactly once. Anything else is a
``CheckpointError`` naming the file and the field.

The checksum only catches accidents: anyone can write a valid file. So the
file is treated as data: ``restore_checkpoint`` refuses import paths that come
from it (``env.name: os:system``, callbacks, policy classes, mapping fns,
custom models and connectors) unless the caller opts in with
``trusted=True``, ``allow=[...]`` or its own ``config=`` (see its docstring
and ``marl_runner.checkpoint_trust``).

It is written atomically: to a hidden temp file in the target's directory,
flushed and fsynced, then renamed over the target (``os.replace``), so a
reader sees the old checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marl_runner.checkpoint_trust import ImportRef, chain_imports, config_imports
from marl_runner.config import RunnerConfig
from marl_runner.sampling.runner import EnvRunner

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointError",
    "checkpoint_config",
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
    used: list[str | None] = [None] * len(arrays)
    policies = _decode(header["policies"], arrays, used, path, "policies")
    unused = [i for i, where in enumerate(used) if where is None]
    if unused:
        raise CheckpointError(
            f"{path}: checkpoint field arrays[{unused[0]}] is never referenced; expected each "
            "array to be referenced exactly once"
        )
    _check_policies(policies, path)
    return {
        "format": header["format"],
        "version": header["version"],
        "config": header["config"],
        "policies": policies,
    }


def _parse_header(raw: memoryview, path: Path) -> dict[str, Any]:
    """The header's JSON, checked for depth, keys and their types; never a partial object."""
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: checkpoint header is not valid JSON: {err}") from None
    except RecursionError:
        raise CheckpointError(
            f"{path}: checkpoint header is nested too deeply (expected at most {_MAX_DEPTH} levels)"
        ) from None
    _check_depth(header, path)
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


def _check_depth(value: Any, path: Path) -> None:
    """Rejects JSON nested deeper than ``_MAX_DEPTH`` (later steps recurse over it)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise CheckpointError(
                f"{path}: checkpoint header is nested too deeply (expected at most "
                f"{_MAX_DEPTH} levels)"
            )
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)


def _read_arrays(entries: list[Any], blob: memoryview, path: Path) -> list[np.ndarray]:
    """The arrays, after every entry is checked: nothing is allocated for a bad file."""
    layout = [_array_entry(entry, i, len(blob), path) for i, entry in enumerate(entries)]
    end, previous = 0, None
    for offset, nbytes, i in sorted((e[2], e[3], i) for i, e in enumerate(layout) if e[3]):
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
    except TypeError:
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


def _decode(
    value: Any, arrays: list[np.ndarray], used: list[str | None], path: Path, where: str
) -> Any:
    """The state tree with tags resolved; each array may be referenced once (no aliasing)."""
    if isinstance(value, list):
        return [_decode(v, arrays, used, path, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    tag = next(iter(value)) if len(value) == 1 else None
    if tag not in _TAGS:
        return {k: _decode(v, arrays, used, path, f"{where}.{k}") for k, v in value.items()}
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
        return tuple(_decode(v, arrays, used, path, f"{where}[{i}]") for i, v in enumerate(inner))
    out = {}
    for i, pair in enumerate(inner):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise CheckpointError(
                f"{path}: checkpoint field {where}.__items__[{i}] is {_short(pair)}; expected "
                "a [key, value] pair"
            )
        key = _decode(pair[0], arrays, used, path, f"{where}.__items__[{i}][0]")
        if isinstance(key, list | dict | np.ndarray):
            raise CheckpointError(
                f"{path}: checkpoint field {where}.__items__[{i}][0] is a "
                f"{type(key).__name__}; expected a hashable dict key"
            )
        out[key] = _decode(pair[1], arrays, used, path, f"{where}.__items__[{i}][1]")
    return out


def _check_policies(policies: Any, path: Path) -> None:
    """Each policy's entry has its state keys with the right kinds of values."""
    for pid, state in policies.items():
        where = f"{path}: checkpoint field policies.{pid}"
        if not isinstance(state, dict):
            raise CheckpointError(f"{where} is {_short(state)}; expected an object")
        for key in _STATE_KEYS:
            if key not in state:
                raise CheckpointError(f"{where} has no {key!r}")
        unknown = sorted(set(state) - {*_STATE_KEYS, "policy_state"})
        if unknown:
            raise CheckpointError(
                f"{where} has unknown fields {unknown}; expected {[*_STATE_KEYS, 'policy_state']}"
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


def restore_checkpoint(
    path: str | os.PathLike[str],
    *,
    config: RunnerConfig | Mapping[str, Any] | None = None,
    trusted: bool = False,
    allow: Iterable[str] = (),
    overrides: Iterable[str] | None = None,
    runner_cls: type[EnvRunner] | None = None,
    **runner_kwargs: Any,
) -> EnvRunner:
    """A new ``EnvRunner`` built from the checkpoint's config, with its weights and connector state.

    Safe by default, like ``torch.load(weights_only=True)``: an import path
    that comes from the file (a ``module:callable`` env name, mapping fn,
    callbacks, policy class, model class, ``module:Class`` connector or a
    lambda connector's ``fn``, in the config or in the connector state) is
    refused with a ``CheckpointError`` naming the file, the field and the
    value, because importing and calling it runs code whoever wrote the file
    chose. Registered env and connector names, ``TorchPolicy`` /
    ``RandomPolicy``, built-in model types and the PettingZoo / MPE2 env
    constructors are data and need no opt-in. To opt in, either:

    - ``trusted=True``: the file is yours; import whatever it names;
    - ``allow=["mypkg.envs:make_env", ...]``: import exactly these paths;
    - ``config=my_config``: build the runner from your config (its import
      paths are yours) and read only weights and connector state from the
      file; connector state naming other import paths still needs ``allow``.

    ``overrides`` are ``"dotted.key=value"`` config overrides applied before
    the runner is built (e.g. ``["num_envs=16"]``); import paths they set are
    the caller's. ``runner_kwargs`` go to ``EnvRunner`` (``policies``,
    ``policy_mapping_fn``, ``callbacks``), for what the config cannot hold.
    ``runner_cls`` builds a subclass instead.

    Raises:
        CheckpointError: unreadable, corrupt (checksum) or malformed file,
            unknown format or version, an import path from the file that was
            not opted into, or a checkpointed policy the restored runner does
            not have.
    """
    payload, runner_config = _checked(path, config, trusted, allow, overrides)
    runner = (runner_cls or EnvRunner)(runner_config, **runner_kwargs)
    try:
        _apply_state(runner, payload["policies"], path)
    except BaseException:
        runner.stop()
        raise
    return runner


def checkpoint_config(
    path: str | os.PathLike[str],
    *,
    config: RunnerConfig | Mapping[str, Any] | None = None,
    trusted: bool = False,
    allow: Iterable[str] = (),
    overrides: Iterable[str] | None = None,
) -> RunnerConfig:
    """The config ``restore_checkpoint`` with these arguments would build its runner from,
    after the same checks (nothing is imported or built).

    For callers that need the config first (e.g. to wrap the config's callbacks class):
    pass the result back as ``restore_checkpoint(path, config=..., allow=...)``.
    """
    return _checked(path, config, trusted, allow, overrides)[1]


def _checked(
    path: str | os.PathLike[str],
    config: RunnerConfig | Mapping[str, Any] | None,
    trusted: bool,
    allow: Iterable[str],
    overrides: Iterable[str] | None,
) -> tuple[dict[str, Any], RunnerConfig]:
    """The loaded payload and the config to build from, import paths checked unless trusted."""
    if isinstance(allow, str):
        raise TypeError(f"allow: got the string {allow!r}, expected a list of import paths")
    payload = load_checkpoint(path)
    runner_config, from_file = _runner_config(payload, path, config, overrides)
    if not trusted:
        _refuse_file_imports(payload["policies"], runner_config, from_file, set(allow), path)
    return payload, runner_config


def _runner_config(
    payload: dict[str, Any],
    path: Any,
    config: RunnerConfig | Mapping[str, Any] | None,
    overrides: Iterable[str] | None,
) -> tuple[RunnerConfig, set[ImportRef]]:
    """The config to build the runner from, and the import paths in it that the file chose."""
    if config is None:
        try:
            base = RunnerConfig.from_dict(payload["config"])
        except (ValueError, TypeError) as err:
            raise CheckpointError(f"{path}: checkpoint field config is not valid: {err}") from None
        from_file = set(config_imports(base))
    else:
        base = config if isinstance(config, RunnerConfig) else RunnerConfig.from_dict(config)
        from_file = set()
    return (base.with_overrides(overrides) if overrides else base), from_file


def _refuse_file_imports(
    policies: dict[str, Any],
    config: RunnerConfig,
    from_file: set[ImportRef],
    allow: set[str],
    path: Any,
) -> None:
    """Raises unless every import path the file chose is one the caller allowed or gave."""
    in_config = config_imports(config)
    allowed = allow | {value for key, value in in_config if (key, value) not in from_file}
    refs = [ref for ref in in_config if ref in from_file]
    for pid, state in policies.items():
        for kind in ("agent_connectors", "action_connectors"):
            try:
                refs += chain_imports(state[kind], f"policies.{pid}.{kind}")
            except ValueError as err:
                raise CheckpointError(f"{path}: checkpoint field {err}") from None
    refused = [(key, value) for key, value in refs if value not in allowed]
    if not refused:
        return
    key, value = refused[0]
    also = "".join(f"; also {k} = {v!r}" for k, v in refused[1:])
    paths = ", ".join(repr(v) for v in dict.fromkeys(v for _, v in refused))
    raise CheckpointError(
        f"{path}: checkpoint field {key} names the import path {value!r}{also}. Restoring "
        "never imports names that come from the file, because importing and calling them "
        "runs code. If you trust this file, pass trusted=True (marl-runner evaluate "
        f"--trusted), or allow=[{paths}], "
        "or your own config= (then only weights and connector state come from the file)"
    )


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
