"""Hostile requests to the policy server: refused with a 4xx naming the agent and the field,
before they touch any state; the server, `--out` and the other clients go on (issue 17)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from marl_runner.io import list_batch_files, read_batches
from marl_runner.serving import codec
from marl_runner.serving.value_checks import RequestError, check_action_mask, space_array
from tests.test_serving_http import FILTER, serve_config, served, wait_for


def upload(rows: int = 4, **columns: Any) -> dict:
    """A well-formed experiences upload for policy "p" (obs Box(-10, 10, (3,)), Discrete(4))."""
    base = {
        "obs": np.zeros((rows, 3), np.float32),
        "new_obs": np.zeros((rows, 3), np.float32),
        "actions": np.arange(rows, dtype=np.int64) % 4,
        "rewards": np.ones(rows, np.float32),
        "terminateds": np.arange(rows) == rows - 1,
        "truncateds": np.zeros(rows, bool),
        "eps_id": np.full(rows, 7, np.int64),
        "t": np.arange(rows, dtype=np.int64),
        "infos": [{} for _ in range(rows)],
    }
    return {"env_steps": rows, "policies": {"p": {**base, **columns}}}


def post_binary(handle: Any, name: str, value: Any) -> tuple[int, Any]:
    return handle.request("POST", f"/v1/{name}", codec.encode(value), {"Content-Type": codec.BINARY})


def filter_stats(handle: Any) -> dict:
    return dict(handle.server.runner.get_state()["p"]["agent_connectors"])[FILTER[1]]["state"]


def start(handle: Any) -> str:
    status, answer = handle.post_json("start_episode", {})
    assert status == 200, answer
    return answer["episode_id"]


# ---------------------------------------------------------------- finding 1: nothing stops --out


def test_upload_with_a_slash_in_a_column_name_is_refused_and_out_goes_on(tmp_path):
    with served(out_dir=tmp_path) as handle:
        status, answer = post_binary(handle, "experiences", upload(**{"a/b": np.zeros(4)}))
        assert status == 400 and "'a/b'" in answer["error"] and "'/'" in answer["error"], answer
        assert post_binary(handle, "experiences", upload())[0] == 200
        wait_for(lambda: len(list_batch_files(tmp_path)) == 1)
    (batch,) = read_batches(tmp_path)
    assert batch.policy_batches["p"]["rewards"].tolist() == [1.0] * 4


def test_complex_info_is_refused_naming_the_agent_and_out_goes_on(tmp_path):
    with served(out_dir=tmp_path) as handle:
        eid = start(handle)
        assert handle.post_json("get_action", {"episode_id": eid, "obs": {"a0": [0, 0, 0]}})[0] == 200
        hostile = {"episode_id": eid, "rewards": {"a0": 1.0}, "infos": {"a0": {"z": np.array([1 + 2j])}}}
        status, answer = post_binary(handle, "log_returns", hostile)
        assert status == 400 and "infos of agent 'a0'['z']" in answer["error"], answer
        assert "complex" in answer["error"]
        # The refused request added nothing: the reward below is the step's only one.
        fine = {"episode_id": eid, "rewards": {"a0": 2.0}, "infos": {"a0": {"z": np.arange(2)}}}
        assert post_binary(handle, "log_returns", fine)[0] == 200
        assert handle.post_json("end_episode", {"episode_id": eid, "obs": {"a0": [0, 0, 0]}})[0] == 200
        wait_for(lambda: len(list_batch_files(tmp_path)) == 1)
    (batch,) = read_batches(tmp_path)
    assert batch.policy_batches["p"]["rewards"].tolist() == [2.0]
    assert batch.policy_batches["p"]["infos"][0] == {"z": [0, 1]}


# ------------------------------------------------ finding 2: bad observations never reach the filter


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "observation of agent 'a0' has a NaN at index 1"),
        (float("inf"), "observation of agent 'a0' has an inf at index 1"),
        (1e300, "observation of agent 'a0' has 1e+300 at index 1, outside Box"),
        (1.5, "observation of agent 'a0' has 1.5 at index 1, outside Box"),
    ],
)
def test_non_finite_or_out_of_bounds_observations_are_refused_and_filters_stay_finite(value, message):
    with served() as handle:
        eid = start(handle)
        status, answer = post_binary(
            handle, "get_action", {"episode_id": eid, "obs": {"a0": np.array([0.0, value, 0.0])}}
        )
        assert status == 400 and message in answer["error"], answer
        other = start(handle)
        for step in range(3):
            obs = {"a0": [0.1 * step, -0.2, 0.3], "a1": [0.5, 0.5, -0.5]}
            status, answer = handle.post_json("get_action", {"episode_id": other, "obs": obs})
            assert status == 200 and all(a in range(4) for a in answer["actions"].values()), answer
        stats = filter_stats(handle)
        assert stats["count"] == 6
        assert np.isfinite(stats["mean"]).all() and np.isfinite(stats["m2"]).all()


def test_dict_obs_and_info_action_masks_must_allow_an_action():
    with served() as handle:
        eid = start(handle)
        for mask, message in (([0, 0, 0, 0], "allows no action"), ([1, 2, 0, 0], "expected 0 or 1"),
                              ([1, 1], "2 entries, expected 4")):
            body = {"episode_id": eid, "rewards": {}, "infos": {"a0": {"action_mask": mask}}}
            status, answer = handle.post_json("log_returns", body)
            assert status == 400 and "infos of agent 'a0'['action_mask']" in answer["error"], answer
            assert message in answer["error"], answer
        body = {"episode_id": eid, "rewards": {}, "infos": {"a0": {"action_mask": [0, 0, 1, 0]}}}
        assert handle.post_json("log_returns", body)[0] == 200
        status, answer = handle.post_json("get_action", {"episode_id": eid, "obs": {"a0": [0, 0, 0]}})
        assert status == 200 and answer["actions"] == {"a0": 2}, answer


# -------------------------------------------- finding 3: rewards of unknown agents, huge rewards


def test_rewards_of_unknown_agents_or_beyond_float32_are_refused_and_sums_stay_exact():
    with served() as handle:
        eid = start(handle)
        assert handle.post_json("get_action", {"episode_id": eid, "obs": {"a0": [0, 0, 0]}})[0] == 200
        cases = [
            ({"zz": 1.0}, "rewards: unknown agent 'zz'"),
            ({"a0": 10**400}, "reward of agent 'a0': 1000000000"),
            ({"a0": 1e39}, "does not fit the float32 reward column"),
            ({"a0": True}, "is not a finite number"),
        ]
        for rewards, message in cases:
            status, answer = handle.post_json("log_returns", {"episode_id": eid, "rewards": rewards})
            assert status == 400 and message in answer["error"], answer
        # Each reward fits float32, their sum does not: the second call is refused whole.
        assert handle.post_json("log_returns", {"episode_id": eid, "rewards": {"a0": 3e38}})[0] == 200
        status, answer = handle.post_json(
            "log_returns", {"episode_id": eid, "rewards": {"a1": 1.0, "a0": 3e38}}
        )
        assert status == 400 and "rewards of agent 'a0' add up to 6e+38" in answer["error"], answer
        assert handle.post_json("log_returns", {"episode_id": eid, "rewards": {"a0": -3e38}})[0] == 200
        assert handle.post_json("log_returns", {"episode_id": eid, "rewards": {"a0": 0.5}})[0] == 200
        assert handle.post_json("end_episode", {"episode_id": eid, "obs": {"a0": [0, 0, 0]}})[0] == 200
        wait_for(lambda: len(handle.batches) == 1)
    assert handle.batches[0].policy_batches["p"]["rewards"].tolist() == [0.5]


# ----------------------------------------- finding 4: upload values checked, env steps from rows


def test_upload_values_are_checked_per_column():
    with served() as handle:
        cases = [
            (upload(rows=3, obs=[[1e308, "not a number", None]] * 3), "expected numbers, got an array of object"),
            (upload(obs=np.full((4, 3), np.nan, np.float32)), "has a NaN at index (0, 0)"),
            (upload(obs=np.full((4, 3), 11.0, np.float32)), "outside Box(-10.0, 10.0"),
            (upload(obs=np.zeros((4, 2), np.float32)), "shape (4, 2), expected (4, 3)"),
            (upload(actions=np.array([0, 1, 2, 9])), "has 9 at index 3"),
            (upload(rewards=np.array([1, np.inf, 1, 1])), "['rewards'] has an inf at index 1"),
            (upload(terminateds=np.array([0, 2, 0, 1])), "expected true/false"),
            (upload(eps_id=np.zeros(4)), "expected one integer per row"),
            (upload(infos=[{}, {}, {"x": float("nan")}, {}]), "row 2['x']: nan is not finite"),
            (upload(t=np.arange(3)), "columns differ in length"),
            (upload(extra=["a", "b", "c", "d"]), "['extra']: expected numbers"),
        ]
        for value, message in cases:
            status, answer = post_binary(handle, "experiences", value)
            assert status == 400 and message in answer["error"], (message, answer)
        assert handle.server.uploads.empty()


def test_upload_env_steps_are_counted_from_the_rows_not_taken_from_the_client():
    with served() as handle:
        value = upload(rows=6, t=np.array([0, 1, 2, 0, 1, 2]), eps_id=np.array([1, 1, 1, 2, 2, 2]))
        value["env_steps"] = 10**15
        status, answer = post_binary(handle, "experiences", value)
        assert status == 200, answer
        wait_for(lambda: len(handle.batches) == 1)
        # Over JSON too (lists, converted to the policy's dtypes).
        as_json = json.loads(codec.encode(upload(rows=2), codec.JSON))
        as_json["env_steps"] = 10**15
        assert handle.post_json("experiences", as_json)[0] == 200
        wait_for(lambda: len(handle.batches) == 2)
    assert [b.env_steps() for b in handle.batches] == [6, 2]
    assert handle.batches[1].policy_batches["p"]["obs"].dtype == np.float32


# ---------------------------------------------------------- finding 7: backlog and bounded threads


def test_64_clients_connecting_at_once_all_get_answers():
    results: list = []
    with served() as handle:
        address = handle.server.server_address_tuple()
        barrier = threading.Barrier(64)

        def client() -> None:
            barrier.wait(10)
            with socket.create_connection(address, timeout=30) as sock:
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                results.append(sock.makefile("rb").readline())

        threads = [threading.Thread(target=client, daemon=True) for _ in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(results) == 64 and all(r == b"HTTP/1.1 200 OK\r\n" for r in results), results


def test_many_open_connections_take_no_thread_each_and_idle_ones_time_out():
    with served(idle_timeout_s=0.5) as handle:
        address = handle.server.server_address_tuple()
        before = threading.active_count()
        silent = [socket.create_connection(address, timeout=30) for _ in range(200)]
        partial = [socket.create_connection(address, timeout=30) for _ in range(8)]
        try:
            for sock in partial:
                sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
            time.sleep(0.2)
            assert threading.active_count() <= before + 1  # an event loop serves them all
            status, answer = handle.request("GET", "/v1/health")
            assert status == 200 and answer["ok"] is True
            wait_for(lambda: all(sock.recv(1) == b"" for sock in silent[:5] + partial))
        finally:
            for sock in silent + partial:
                sock.close()


def _append_answer_or_error(handle: Any, answers: list) -> None:
    try:
        answers.append(handle.post_json("start_episode", {}))
    except Exception as error:  # shown by the test's assertion, not lost in the thread
        answers.append(error)


def test_requests_over_the_concurrency_limit_get_503_with_retry_after():
    # The second request waits in the only slot for the only episode until that episode
    # times out (never, in this test: 4 s once was too short for the health request below
    # in a CI run of make test) or the server stops, which answers it.
    config = serve_config(num_envs=1, external_episode_timeout_s=120.0)
    waiting: list = []
    with served(config, max_concurrency=1) as handle:
        status, first = handle.post_json("start_episode", {})
        assert status == 200
        # The first answer can reach us before its handler has counted itself out.
        wait_for(lambda: handle.server._in_progress == 0)
        # It waits for the only episode: the only request handled at once.
        thread = threading.Thread(target=_append_answer_or_error, args=(handle, waiting))
        thread.start()
        wait_for(lambda: handle.server._in_progress == 1)
        host, port = handle.server.server_address_tuple()
        connection = http.client.HTTPConnection(host, port, timeout=30)
        connection.request("GET", "/v1/health")
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 503 and response.getheader("Retry-After") == "1", answer
        connection.close()
    thread.join(30)
    assert first["episode_id"]
    assert len(waiting) == 1 and isinstance(waiting[0], tuple), waiting
    [(status, answer)] = waiting  # answered, not left hanging, when the server stopped
    assert status == 503 and "stopped" in answer["error"], answer


# ---------------------------------------------------------- the value checks themselves


def test_space_array_refuses_what_a_cast_would_change():
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    with pytest.raises(RequestError, match=r"x has 1e\+300 at index 0, too large for float32"):
        space_array(unbounded, [1e300, 0.0], "x")
    assert space_array(unbounded, [1, 2], "x").dtype == np.float32
    image = gym.spaces.Box(0, 255, (2, 2), np.uint8)
    with pytest.raises(RequestError, match=r"has 256 at index \(1, 0\), outside"):
        space_array(image, [[0, 0], [256, 0]], "x")
    with pytest.raises(RequestError, match="expected integers"):
        space_array(image, [[0.5, 0], [0, 0]], "x")
    with pytest.raises(RequestError, match="expected numbers, got an array of complex128"):
        space_array(unbounded, np.array([1j, 0]), "x")
    multi = gym.spaces.MultiDiscrete([3, 2])
    with pytest.raises(RequestError, match="has 2 at index 1"):
        space_array(multi, [2, 2], "x")


def test_action_masks_fit_multidiscrete_spaces_per_dimension():
    space = gym.spaces.MultiDiscrete([2, 3])
    check_action_mask([1, 0, 0, 0, 1], space, "m")
    with pytest.raises(RequestError, match="allows no action for dimension 1"):
        check_action_mask([1, 1, 0, 0, 0], space, "m")
    with pytest.raises(RequestError, match="needs a Discrete or MultiDiscrete"):
        check_action_mask([1, 1], gym.spaces.MultiBinary(2), "m")
