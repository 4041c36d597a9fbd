"""Hostile requests to the policy server: refused with a 4xx naming the agent and the field,
before they touch any state; the server, `--out` and the other clients go on (issue 17)."""

from __future__ import annotations

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
from tests.test_serving_http import FILTER, served, wait_for


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


def test_64_clients_connecting_at_once_while_the_server_is_busy_all_get_answers():
    results: list = []
    with served() as handle:
        address = handle.server.server_address_tuple()
        handle.server._httpd.shutdown()  # the accept loop stalls: only the listen backlog holds
        barrier = threading.Barrier(65)

        def client() -> None:
            try:
                sock = socket.create_connection(address, timeout=3)
            except OSError as exc:  # a backlog too short drops the handshake: timeout
                barrier.wait(10)
                results.append(exc)
                return
            with sock:
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                barrier.wait(10)
                sock.settimeout(30)
                results.append(sock.makefile("rb").readline())

        threads = [threading.Thread(target=client, daemon=True) for _ in range(64)]
        for thread in threads:
            thread.start()
        barrier.wait(30)  # every client connected (or gave up) before the loop runs again
        handle.server.start()
        for thread in threads:
            thread.join(60)
    assert len(results) == 64 and all(r == b"HTTP/1.1 200 OK\r\n" for r in results), results


def test_threads_stay_bounded_with_many_open_connections_and_idle_ones_time_out():
    # One client address here: the per-client cap must not be what refuses the 208 connections.
    with served(max_workers=4, idle_timeout_s=0.5, max_connections_per_client=1024) as handle:
        address = handle.server.server_address_tuple()
        before = threading.active_count()
        silent = [socket.create_connection(address, timeout=30) for _ in range(200)]
        # Connections that sent half a request hold a worker until they go idle.
        partial = [socket.create_connection(address, timeout=30) for _ in range(8)]
        try:
            for sock in partial:
                sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
            wait_for(lambda: handle.server._httpd.num_workers == 4)
            time.sleep(0.3)  # room for any thread that would start per connection
            assert threading.active_count() <= before + 4
            # Silent connections take no worker, half-sent ones time out: a client gets served.
            status, answer = handle.request("GET", "/v1/health")
            assert status == 200 and answer["ok"] is True
            wait_for(lambda: all(sock.recv(1) == b"" for sock in silent[:5]))  # closed as idle
        finally:
            for sock in silent + partial:
                sock.close()
        assert handle.server._httpd.num_workers == 4


def test_busy_keep_alive_clients_take_turns_when_workers_run_out():
    with served(max_workers=1) as handle:
        host, port = handle.server.server_address_tuple()
        import http.client

        first = http.client.HTTPConnection(host, port, timeout=30)
        first.request("GET", "/v1/health")
        response = first.getresponse()
        response.read()
        assert response.status == 200
        # A second client now waits for the only worker, held by the first connection;
        # the first's next answer closes its connection so the second gets served.
        answers: list = []
        second = threading.Thread(target=lambda: answers.append(handle.request("GET", "/v1/health")))
        second.start()
        wait_for(lambda: handle.server._httpd.saturated)
        first.request("GET", "/v1/health")
        response = first.getresponse()
        response.read()
        assert response.getheader("Connection") == "close"
        second.join(30)
        first.close()
    assert answers and answers[0][0] == 200


# ---------------------------------------------------------- finding 8: body memory in flight


def test_bodies_beyond_the_memory_budget_wait_then_get_503_with_retry_after(monkeypatch):
    from marl_runner.serving import server as server_module

    monkeypatch.setattr(server_module, "BODY_WAIT_S", 0.2)
    with served(max_bytes_in_flight=1000) as handle:
        budget = handle.server.body_budget
        held = budget.open(1000)
        assert held.grow_to(1000, 1.0)
        host, port = handle.server.server_address_tuple()
        import http.client

        connection = http.client.HTTPConnection(host, port, timeout=30)
        connection.request("POST", "/v1/start_episode", b"{}", {"Content-Type": codec.JSON})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 503 and response.getheader("Retry-After") == "1", answer
        assert "retry" in answer["error"]
        held.close()
        # The refused body was read and dropped: the same connection serves the retry.
        connection.request("POST", "/v1/start_episode", b"{}", {"Content-Type": codec.JSON})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
        connection.close()
        wait_for(lambda: budget.in_flight == 0)  # released once the answer is out


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
