"""Malformed checkpoint headers: every one is a CheckpointError naming the file and the field,
raised before anything is allocated for the arrays."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marl_runner.checkpoint import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointError,
    load_checkpoint,
    restore_checkpoint,
)

PREFIX = struct.Struct("<8sIQ")


def raw_checkpoint(path: Path, header: dict[str, Any] | bytes, blob: bytes = b"") -> Path:
    """A file with a valid magic, version and checksum around ``header`` and ``blob``."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = PREFIX.pack(b"MARLCKPT", FORMAT_VERSION, len(text)) + text + blob
    path.write_bytes(body + hashlib.sha256(body).digest())
    return path


def header(entries: list[Any], weights: Any, **changes: Any) -> dict[str, Any]:
    """One policy ``p`` whose weights are ``weights``; ``changes`` replace header fields."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "config": {},
        "policies": {"p": {"weights": weights, "agent_connectors": [], "action_connectors": []}},
        "arrays": entries,
        **changes,
    }


def entry(shape: list[Any], offset: int = 0, dtype: str = "<f4", nbytes: int | None = None) -> dict:
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize if nbytes is None else nbytes
    return {"dtype": dtype, "shape": shape, "offset": offset, "nbytes": size}


def test_a_valid_raw_file_loads(tmp_path):
    data = np.arange(6, dtype=np.float32)
    path = raw_checkpoint(
        tmp_path / "ok.ckpt",
        header([entry([2, 3]), entry([0, 5], offset=24)], {"w": {"__ndarray__": 0},
                                                           "e": {"__ndarray__": 1}}),
        data.tobytes(),
    )
    weights = load_checkpoint(path)["policies"]["p"]["weights"]
    np.testing.assert_array_equal(weights["w"], data.reshape(2, 3))
    assert weights["e"].shape == (0, 5)


def test_entries_aliasing_one_array_are_refused(tmp_path):
    """The finding: 1,907 entries aliasing one 1 MB array cost +1.9 GB on restore."""
    blob = np.zeros(1 << 18, np.float32).tobytes()  # 1 MB
    arrays = [entry([1 << 18])] * 50
    weights = {f"w{i}": {"__ndarray__": i} for i in range(50)}
    path = raw_checkpoint(tmp_path / "alias.ckpt", header(arrays, weights), blob)
    with pytest.raises(CheckpointError, match=r"alias.ckpt: checkpoint field arrays\[1\] overlaps"):
        load_checkpoint(path)
    partial = [entry([10]), entry([10], offset=20)]  # 40 bytes each, overlapping by 20
    path = raw_checkpoint(tmp_path / "overlap.ckpt", header(partial, {}), bytes(60))
    with pytest.raises(CheckpointError, match=r"arrays\[1\] overlaps arrays\[0\]"):
        load_checkpoint(path)


def test_one_array_referenced_twice_or_never_is_refused(tmp_path):
    twice = {"a": {"__ndarray__": 0}, "b": {"__ndarray__": 0}}
    path = raw_checkpoint(tmp_path / "twice.ckpt", header([entry([2])], twice), bytes(8))
    with pytest.raises(CheckpointError, match=r"policies.p.weights.a and policies.p.weights.b"):
        load_checkpoint(path)
    path = raw_checkpoint(tmp_path / "never.ckpt", header([entry([2])], {}), bytes(8))
    with pytest.raises(CheckpointError, match=r"arrays\[0\] is never referenced"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("bad_entry", "field"),
    [
        (entry([1 << 40, 1 << 40, 1 << 40], nbytes=0), "arrays[0].shape"),  # product overflows
        (entry([0, 1e20], nbytes=0), "arrays[0].shape"),  # a float dimension
        (entry([0, 1 << 62], nbytes=0), "arrays[0].shape"),  # empty, but past numpy's limit
        (entry([-1, -4], nbytes=16), "arrays[0].shape"),
        (entry([1] * 40), "arrays[0].shape"),
        (entry(["2"], nbytes=8), "arrays[0].shape"),
        (entry([2], dtype="O"), "arrays[0].dtype"),
        (entry([2], dtype="f4,i4", nbytes=16), "arrays[0].dtype"),
        (entry([2], dtype="<f3", nbytes=6), "arrays[0].dtype"),
        ({**entry([2]), "dtype": 4}, "arrays[0].dtype"),
        ({**entry([2]), "offset": -8}, "arrays[0].offset"),
        ({**entry([2]), "offset": True}, "arrays[0].offset"),
        ({**entry([2]), "nbytes": 7}, "arrays[0]: shape [2]"),
        ({**entry([2]), "offset": 8}, "arrays[0]: bytes 8..16 lie past the end"),
        ({**entry([2]), "extra": 1}, "arrays[0] is"),
        ([2], "arrays[0] is"),
    ],
)
def test_bad_array_entries_are_refused(tmp_path, bad_entry, field):
    path = raw_checkpoint(
        tmp_path / "bad.ckpt", header([bad_entry], {"w": {"__ndarray__": 0}}), bytes(8)
    )
    with pytest.raises(CheckpointError, match=re.escape(f"bad.ckpt: checkpoint field {field}")):
        load_checkpoint(path)


NESTED = {"policies": {"p": {}}}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"config": []}, "header field 'config' is a JSON list, expected a JSON object"),
        ({"policies": "x"}, "header field 'policies' is a JSON string"),
        ({"arrays": {}}, "header field 'arrays' is a JSON object, expected a JSON list"),
        ({"format": "other"}, "header field 'format' is 'other'"),
        ({"version": "2"}, "header version '2' is not supported"),
        ({"extra": 1}, "unknown fields ['extra']"),
        ({"policies": {"p": []}}, "field policies.p is the list"),
        ({"policies": {"__tuple__": []}}, "field policies is the object {'__tuple__': []}"),
        ({"policies": {"p": {"weights": {}}}}, "field policies.p has no 'agent_connectors'"),
        (
            {"policies": {"p": {"weights": {}, "agent_connectors": {}, "action_connectors": []}}},
            "field policies.p.agent_connectors is the object",
        ),
        (
            {"policies": {"p": {"weights": {"x": {"__tuple__": 3}}, "agent_connectors": [],
                                "action_connectors": []}}},
            "field policies.p.weights.x.__tuple__ is the int 3",
        ),
        (
            {"policies": {"p": {"weights": {"x": {"__items__": [[1]]}}, "agent_connectors": [],
                                "action_connectors": []}}},
            "field policies.p.weights.x.__items__[0] is the list [1]",
        ),
        (
            {"policies": {"p": {"weights": {"x": {"__ndarray__": 3}}, "agent_connectors": [],
                                "action_connectors": []}}},
            "field policies.p.weights.x refers to array 3",
        ),
    ],
)
def test_malformed_headers_name_the_field(tmp_path, changes, message):
    path = raw_checkpoint(tmp_path / "bad.ckpt", header([], {}, **changes))
    with pytest.raises(CheckpointError, match=re.escape(message)) as err:
        load_checkpoint(path)
    assert "bad.ckpt" in str(err.value)


def test_missing_header_fields_and_non_objects(tmp_path):
    for key in ("config", "policies", "arrays"):
        data = header([], {})
        del data[key]
        path = raw_checkpoint(tmp_path / "bad.ckpt", data)
        with pytest.raises(CheckpointError, match=f"bad.ckpt: checkpoint header has no '{key}'"):
            load_checkpoint(path)
    for text in (b"[1, 2]", b"{not json", b"\xff\xfe"):
        path = raw_checkpoint(tmp_path / "bad.ckpt", text)
        with pytest.raises(CheckpointError, match="bad.ckpt: checkpoint header is"):
            load_checkpoint(path)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_headers_are_refused(tmp_path, depth):
    """The finding: deep nesting raised RecursionError (or built the config) instead."""
    nested = b'{"a":' * depth + b"1" + b"}" * depth
    text = json.dumps(header([], {})).encode().replace(b'"config": {}', b'"config": ' + nested)
    path = raw_checkpoint(tmp_path / "deep.ckpt", text)
    with pytest.raises(CheckpointError, match="deep.ckpt: checkpoint header is nested too deeply"):
        restore_checkpoint(path)


def test_a_config_that_is_not_valid_names_the_field(tmp_path):
    path = raw_checkpoint(tmp_path / "cfg.ckpt", header([], {}, config={"env": 3}))
    with pytest.raises(CheckpointError, match="cfg.ckpt: checkpoint field config is not valid"):
        restore_checkpoint(path)
