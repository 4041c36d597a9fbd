"""The wire codec: round trips, and hostile bodies refused without unpickling anything."""

from __future__ import annotations

import json
import pickle
import struct

import numpy as np
import pytest

from marl_runner.serving.codec import BINARY, JSON, CodecError, decode, encode


def frame(header: dict, data: bytes = b"") -> bytes:
    return raw_frame(json.dumps(header).encode(), data)


def raw_frame(header: bytes, data: bytes = b"") -> bytes:
    return b"MRB1" + struct.pack("<I", len(header)) + header + data


def test_round_trip_keeps_arrays_dtypes_and_int_keys():
    value = {
        "obs": {"a0": np.arange(6, dtype=np.float32).reshape(2, 3), 7: np.array([True, False])},
        "nested": [1, 2.5, None, "x", (np.int64(3), np.float32(0.5))],
        "empty": np.zeros((0, 4), np.int16),
    }
    out = decode(encode(value))
    np.testing.assert_array_equal(out["obs"]["a0"], value["obs"]["a0"])
    assert out["obs"]["a0"].dtype == np.float32 and out["obs"][7].dtype == np.bool_
    assert out["nested"] == [1, 2.5, None, "x", [3, 0.5]]
    assert out["empty"].shape == (0, 4) and out["empty"].dtype == np.int16
    out["obs"]["a0"][0, 0] = 9  # a private, writable copy
    assert decode(encode(value, JSON), JSON)["obs"]["7"] == [True, False]


def test_objects_are_never_encoded():
    with pytest.raises(CodecError, match="numeric arrays only"):
        encode({"x": np.array([object()])})
    with pytest.raises(CodecError, match="cannot send a set"):
        encode({"x": {1, 2}})


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_bodies_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"obs": _Exploit(str(marker))})
    with pytest.raises(CodecError, match="pickled or other payloads are refused"):
        decode(payload, BINARY)
    with pytest.raises(CodecError):
        decode(payload, JSON)
    assert not marker.exists()


@pytest.mark.parametrize(
    "body, message",
    [
        (frame({"tree": {"\x00a": 0}, "arrays": [["|O", [1], 0, 8]]}, b"\0" * 8), "numeric dtypes only"),
        (frame({"tree": {"\x00a": 0}, "arrays": [["V8", [1], 0, 8]]}, b"\0" * 8), "numeric dtypes only"),
        (frame({"tree": {"\x00a": 0}, "arrays": [["<f4", [3], 0, 8]]}, b"\0" * 8), "needs 12 bytes"),
        (frame({"tree": {"\x00a": 0}, "arrays": [["<f4", [2], 4, 8]]}, b"\0" * 8), "run past the body"),
        (frame({"tree": {"\x00a": 1}, "arrays": []}), "array reference 1"),
        (frame({"tree": {"\x00a": 0, "x": 1}, "arrays": []}), "one key"),
        (frame({"tree": {"\x00z": 0}, "arrays": []}), "unknown tag"),
        (frame({"tree": 1}), "exactly the keys"),
        (b"MRB1" + struct.pack("<I", 10_000) + b"{}", "runs past the end"),
        (b"MRB1" + struct.pack("<I", 3) + b"{x}", "not valid JSON"),
        (raw_frame(b'{"tree": ' + b"[" * 100_000 + b"]" * 100_000 + b', "arrays": []}'), "JSON"),
    ],
)
def test_malformed_bodies_raise_codec_error(body, message):
    with pytest.raises(CodecError, match=message):
        decode(body)
