"""Fuzzing the policy server: any body on any endpoint gets a 2xx or 4xx, never a 5xx, and
a well-behaved client beside it keeps getting valid actions from finite filter statistics."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marl_runner.serving import codec
from tests.test_serving_http import FILTER, Served, serve_config, served

ENDPOINTS = ["start_episode", "get_action", "log_action", "log_returns", "end_episode",
             "experiences", "state", "info", "health", "nothing"]
AGENTS = ["a0", "a1", "a2", "zz", "", "a/b"]
FIELDS = ["episode_id", "obs", "actions", "rewards", "infos", "truncated", "training_enabled",
          "env_steps", "policies", "filter_deltas"]

hostile_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([0, 1, -1, 3, 4, 1e300, -1e39, 2**63, 1e-320]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), hostile_numbers, st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(AGENTS + FIELDS), inner, max_size=4)
    ),
    max_leaves=12,
)


def filled(dtype: str, shape: tuple, fill: float) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN into ints and the like: whatever the cast gives
        return np.full(shape, fill).astype(dtype)


arrays = st.builds(
    filled,
    st.sampled_from(["float32", "float64", "int64", "uint8", "bool", "complex64"]),
    st.sampled_from([(3,), (3,), (), (2,), (3, 1), (0,), (4, 3)]),
    st.sampled_from([0.0, np.nan, np.inf, 1e300, 5.0, -1.0, 0.5, 2.0]),
)
# Three numbers where an observation of Box(-1, 1, (3,)) goes, one of them hostile.
near_obs = st.lists(hostile_numbers, min_size=3, max_size=3) | st.tuples(
    st.just(0.0), hostile_numbers, st.just(0.0)
).map(list)
values = st.one_of(near_obs, arrays, json_values)
agents = st.sampled_from(AGENTS[:2]) | st.sampled_from(AGENTS)


@st.composite
def structured_bodies(draw: Any, episode_id: str) -> dict:
    """Well-formed envelopes with hostile contents, mostly for a real running episode."""
    body: dict[str, Any] = {}
    if draw(st.integers(0, 4)):
        body["episode_id"] = episode_id if draw(st.integers(0, 5)) else draw(json_values)
    for field in ("obs", "actions"):
        if draw(st.integers(0, 3)):
            body[field] = draw(st.dictionaries(agents, values, min_size=1, max_size=3) | json_values)
    if draw(st.integers(0, 3)):
        body["rewards"] = draw(st.dictionaries(agents, hostile_numbers | json_values, max_size=3))
    if draw(st.booleans()):
        info = st.dictionaries(st.sampled_from(["action_mask", "x", "a/b"]), values, max_size=2)
        body["infos"] = draw(st.dictionaries(agents, info | json_values, max_size=3))
    if draw(st.booleans()):
        columns = draw(st.dictionaries(
            st.sampled_from(["obs", "new_obs", "actions", "rewards", "terminateds", "truncateds",
                             "eps_id", "t", "infos", "x/y", "extra"]),
            st.one_of(arrays, json_values, st.lists(near_obs, min_size=1, max_size=3)), max_size=9,
        ))
        body["policies"] = {draw(st.sampled_from(["p", "q"])): columns}
        body["env_steps"] = draw(hostile_numbers)
    if draw(st.booleans()):
        body["filter_deltas"] = [["p", 1, draw(st.dictionaries(
            st.sampled_from(["count", "mean", "m2"]), st.one_of(arrays, near_obs, hostile_numbers),
            max_size=3,
        ))]]
    for flag in ("truncated", "training_enabled"):
        if draw(st.integers(0, 4)) == 0:
            body[flag] = draw(json_values)
    return body


@pytest.fixture(scope="module")
def handle() -> Iterator[Served]:
    # Episodes a fuzzed start_episode opens and leaves go quiet and free their slots.
    config = serve_config(external_episode_timeout_s=1.0)
    with served(config, max_body_bytes=1 << 20) as served_handle:
        yield served_handle


def send(handle: Served, name: str, body: bytes, content_type: str) -> int:
    host, port = handle.server.server_address_tuple()
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("POST", f"/v1/{name}", body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def encode(value: Any, content_type: str) -> bytes:
    if content_type == codec.BINARY:
        return codec.encode(value)
    return json.dumps(value, default=lambda a: np.real(a).tolist()).encode()


def check_a_good_client(handle: Served) -> None:
    """A fresh episode still plays: valid actions, finite filter statistics, a 200 at each step."""
    status, answer = handle.post_json("start_episode", {})
    assert status == 200, answer
    eid = answer["episode_id"]
    obs = {"a0": [0.1, -0.2, 0.3], "a1": [0.0, 0.5, -0.5]}
    status, answer = handle.post_json("get_action", {"episode_id": eid, "obs": obs})
    assert status == 200 and all(a in range(4) for a in answer["actions"].values()), answer
    assert handle.post_json("log_returns", {"episode_id": eid, "rewards": {"a0": 1.0}})[0] == 200
    assert handle.post_json("end_episode", {"episode_id": eid, "obs": obs})[0] == 200
    stats = dict(handle.server.runner.get_state()["p"]["agent_connectors"])[FILTER[1]]["state"]
    assert np.isfinite(stats["mean"]).all() and np.isfinite(stats["m2"]).all()


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(name=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=300),
       content_type=st.sampled_from([codec.BINARY, codec.JSON]))
def test_random_bytes_never_get_a_5xx(handle, name, raw, content_type):
    for body in (raw, b"MARLBODY" + raw):
        assert send(handle, name, body, content_type) < 500


@FUZZ
@given(name=st.sampled_from(ENDPOINTS), value=json_values,
       content_type=st.sampled_from([codec.BINARY, codec.JSON]))
def test_random_values_never_get_a_5xx(handle, name, value, content_type):
    assert send(handle, name, encode(value, content_type), content_type) < 500


@settings(FUZZ, max_examples=150)
@given(data=st.data(), name=st.sampled_from(ENDPOINTS[:7]),
       content_type=st.sampled_from([codec.BINARY, codec.JSON]))
def test_hostile_values_in_valid_bodies_never_get_a_5xx_nor_harm_a_good_client(
    handle, data, name, content_type
):
    status, answer = handle.post_json("start_episode", {})
    assert status == 200, answer
    eid = answer["episode_id"]
    body = data.draw(structured_bodies(eid))
    assert send(handle, name, encode(body, content_type), content_type) < 500
    handle.post_json("end_episode", {"episode_id": eid, "obs": {}})
    check_a_good_client(handle)
