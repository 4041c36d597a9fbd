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


def raw_frame(header: bytes, data: bytes = b"", version: int = 1) -> bytes:
    return struct.pack("<8sIQ", b"MARLBODY", version, len(header)) + header + data


def entry(dtype: str, shape: list, offset: int, nbytes: int) -> dict:
    return {"dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes}


def one_array(*fields) -> dict:
    return {"tree": {"__ndarray__": 0}, "arrays": [entry(*fields)]}


def test_round_trip_keeps_arrays_dtypes_and_int_keys():
    value = {
        "obs": {"a0": np.arange(6, dtype=np.float32).reshape(2, 3), 7: np.array([True, False])},
        "nested": [1, 2.5, None, "x", (np.int64(3), np.float32(0.5))],
        "empty": np.zeros((0, 4), np.int16),
    }
    out = decode(encode(value))
    np.testing.assert_array_equal(out["obs"]["a0"], value["obs"]["a0"])
    assert out["obs"]["a0"].dtype == np.float32 and out["obs"][7].dtype == np.bool_
    assert out["nested"] == [1, 2.5, None, "x", (3, 0.5)]
    assert out["empty"].shape == (0, 4) and out["empty"].dtype == np.int16
    out["obs"]["a0"][0, 0] = 9  # a private, writable copy
    assert decode(encode(value, JSON), JSON)["obs"]["7"] == [True, False]


def test_the_empty_object_is_the_frame_any_value_gets():
    # Its frame is made once; it must be exactly the frame of the general path, and only
    # that exact frame may skip the checks.
    assert encode({}) == raw_frame(b'{"tree":{},"arrays":[]}')
    assert decode(encode({})) == {} and decode(bytearray(encode({}))) == {}
    assert decode(frame({"tree": {}, "arrays": []})) == {}  # other spacing: the full path
    assert decode(encode({}, JSON), JSON) == {}
    with pytest.raises(CodecError):
        decode(encode({})[:-1])


def test_objects_are_never_encoded():
    with pytest.raises(CodecError, match="body.x: array dtype object is not numeric"):
        encode({"x": np.array([object()])})
    with pytest.raises(CodecError, match="a set cannot be stored"):
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
        (frame(one_array("|O", [1], 0, 8), b"\0" * 8), "expected a numeric dtype"),
        (frame(one_array("V8", [1], 0, 8), b"\0" * 8), "expected a numeric dtype"),
        (frame(one_array("<f4", [3], 0, 8), b"\0" * 8), "is 12 bytes, but nbytes is 8"),
        (frame(one_array("<f4", [2], 4, 8), b"\0" * 8), "lie past the end"),
        (frame({"tree": {"__ndarray__": 1}, "arrays": []}), "refers to array 1"),
        (frame({"tree": [{"__ndarray__": 0}, {"__ndarray__": 0}],
                "arrays": [entry("<f4", [2], 0, 8)]}, b"\0" * 8), "both refer to array 0"),
        (frame({"tree": [], "arrays": [entry("<f4", [2], 0, 8)]}, b"\0" * 8), "never referenced"),
        (frame({"tree": [], "arrays": [entry("<f4", [2], 0, 8), entry("<f4", [2], 4, 8)]},
               b"\0" * 12), "overlaps"),
        (frame({"tree": {"__items__": 3}, "arrays": []}), "expected a list"),
        (frame({"tree": {"__items__": [[{"__tuple__": [[1, 2]]}, 1]]}, "arrays": []}),
         r"__items__\[0\]\[0\] is a tuple that cannot be hashed"),
        (frame({"tree": 1}), "expected exactly 'tree' and 'arrays'"),
        (struct.pack("<8sIQ", b"MARLBODY", 1, 10_000) + b"{}", "past its end"),
        (raw_frame(b"{x}"), "not valid JSON"),
        (raw_frame(b"{}", version=7), "version 7"),
        (raw_frame(b'{"tree": ' + b"[" * 100_000 + b"]" * 100_000 + b', "arrays": []}'), "nested too deeply"),
    ],
)
def test_malformed_bodies_raise_codec_error(body, message):
    with pytest.raises(CodecError, match=message):
        decode(body)
