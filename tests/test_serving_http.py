"""The HTTP policy server and PolicyClient on 127.0.0.1, in both inference modes."""

from __future__ import annotations

import http.client
import json
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marl_runner import EnvRunner, MultiAgentBatch, RunnerConfig
from marl_runner.bench.envs.external_envs import ThreadedExternalEnv, play_scripted_episode
from marl_runner.checks import check_batch_invariants, rewards_per_trajectory
from marl_runner.client import PolicyClient, PolicyServerError
from marl_runner.io import write_batch
from marl_runner.serving import codec
from marl_runner.serving.server import PolicyServer, ServerSetupError

ENV = {
    "name": "marl_runner.bench.envs.external_envs:ThreadedExternalEnv",
    "config": {"num_threads": 0, "num_agents": 3, "late_join": True, "leave": True},
}
SCRIPT = ThreadedExternalEnv(num_threads=0, num_agents=3, late_join=True, leave=True)
FILTER = ["ObsPreprocessorConnector", "MeanStdObservationFilterAgentConnector"]


def serve_config(**overrides: Any) -> RunnerConfig:
    return RunnerConfig.from_dict(
        {
            "env": ENV,
            "vectorize": "external",
            "num_envs": 8,
            "batch_mode": "complete_episodes",
            "policies": {"p": {"model": {"type": "mlp", "hidden": [8]}, "agent_connectors": FILTER}},
            **overrides,
        }
    )


class Served:
    def __init__(self, server: PolicyServer, out_dir: Path | None = None) -> None:
        self.server = server
        self.out_dir = out_dir
        self.outputs: list = []
        self.loop_error: BaseException | None = None

    def on_output(self, item: Any) -> None:
        """Keeps every output; with `out_dir`, writes batches there as `serve --out` does."""
        if self.out_dir is not None and isinstance(item, MultiAgentBatch):
            write_batch(item, self.out_dir, len(self.batches) + 1)
        self.outputs.append(item)

    def serve(self, stop: threading.Event) -> None:
        try:
            self.server.serve(stop, self.on_output)
        except BaseException as exc:
            self.loop_error = exc
            raise

    @property
    def batches(self) -> list[MultiAgentBatch]:
        return [o for o in self.outputs if isinstance(o, MultiAgentBatch)]

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, Any]:
        host, port = self.server.address[len("http://"):].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            payload = response.read()
            kind = response.getheader("Content-Type", codec.JSON)
            return response.status, codec.decode(payload, kind)
        finally:
            connection.close()

    def post_json(self, name: str, value: Any) -> tuple[int, Any]:
        return self.request("POST", f"/v1/{name}", json.dumps(value).encode(),
                            {"Content-Type": codec.JSON})


@contextmanager
def served(
    config: RunnerConfig | None = None, out_dir: Path | None = None, **server_kwargs: Any
) -> Iterator[Served]:
    """A server on 127.0.0.1 (a free port) with its sampling loop in a thread; the loop
    must still be running at the end (a request that stopped it fails the test)."""
    runner = EnvRunner(config or serve_config())
    server = PolicyServer(runner, "127.0.0.1", 0, **server_kwargs).start()
    handle = Served(server, out_dir)
    stop = threading.Event()
    loop = threading.Thread(target=handle.serve, args=(stop,), daemon=True)
    loop.start()
    try:
        yield handle
        assert loop.is_alive(), f"the sampling loop stopped: {handle.loop_error!r}"
    finally:
        stop.set()
        loop.join(10)
        runner.stop()
        server.close()
    assert not loop.is_alive()


def play_from_threads(client: PolicyClient, num_threads: int, episodes: int) -> list:
    played: list = []
    errors: list = []

    def worker(index: int) -> None:
        rng = np.random.default_rng(index)
        try:
            for _ in range(episodes):
                played.append(play_scripted_episode(client, SCRIPT, rng))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    return played


def wait_for(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def totals(batches: list[MultiAgentBatch]) -> list[float]:
    return sorted(round(v, 5) for b in batches for v in rewards_per_trajectory(b).values())


def played_totals(played: list) -> list[float]:
    return sorted(round(v, 5) for e in played for v in e.rewards.values())


def test_remote_inference_batches_concurrent_clients_and_conserves_rewards():
    with served() as handle:
        policy = handle.server.runner.policy_map["p"]
        forward = policy.compute_actions_from_input_dict
        calls = []
        policy.compute_actions_from_input_dict = lambda d, **kw: calls.append(1) or forward(d, **kw)
        with PolicyClient(handle.server.address) as client:
            played = play_from_threads(client, num_threads=8, episodes=2)
        wait_for(lambda: len(handle.batches) == len(played))
        batches = handle.batches
    for batch in batches:
        check_batch_invariants(batch)
    assert totals(batches) == played_totals(played)
    assert len(calls) < sum(e.requests for e in played)


def test_local_inference_sends_experiences_and_pulls_weights():
    with served() as handle:
        runner = handle.server.runner
        state = runner.get_state()
        weights = {k: np.full_like(v, 0.25) for k, v in state["p"]["weights"].items()}
        runner.set_weights({"p": weights})
        forward_calls = []
        forward = runner.policy_map["p"].compute_actions_from_input_dict
        runner.policy_map["p"].compute_actions_from_input_dict = (
            lambda d, **kw: forward_calls.append(1) or forward(d, **kw)
        )
        client = PolicyClient(handle.server.address, inference_mode="local", update_interval_s=0.2)
        try:
            local = client.local_runner
            for name, value in local.get_weights()["p"].items():
                np.testing.assert_array_equal(value, weights[name])
            played = play_from_threads(client, num_threads=4, episodes=2)
            runner.set_weights({"p": {k: np.full_like(v, -0.5) for k, v in weights.items()}})
            wait_for(lambda: all((v == -0.5).all() for v in local.get_weights()["p"].values()))
            # The filter ran in the client; its statistics went up to the server and back.
            server_filter = dict(runner.get_state()["p"]["agent_connectors"])[FILTER[1]]["state"]
            local_filter = dict(local.get_state()["p"]["agent_connectors"])[FILTER[1]]["state"]
            obs_sent = sum(e.requests + 1 for e in played)  # get_action obs rows, at least
            assert server_filter["count"] >= obs_sent
            assert local_filter["count"] >= server_filter["count"]
        finally:
            client.close()
        wait_for(lambda: len(handle.batches) == len(played))
        batches = handle.batches
    assert not forward_calls  # the server never ran the policy: only experiences came in
    for batch in batches:
        check_batch_invariants(batch)
    assert totals(batches) == played_totals(played)


def test_bad_requests_get_4xx_with_a_message_and_the_server_goes_on():
    with served(max_body_bytes=4096) as handle:
        status, answer = handle.post_json("start_episode", {})
        assert status == 200
        eid = answer["episode_id"]
        good_obs = {"a0": [0.1, 0.2, 0.3]}
        cases = [
            (handle.request("POST", "/v1/get_action", b"\x00garbage", {"Content-Type": codec.BINARY}),
             400, "marker"),
            (handle.request("POST", "/v1/get_action", b"{not json", {"Content-Type": codec.JSON}),
             400, "not valid JSON"),
            (handle.post_json("get_action", [1, 2]), 400, "must be an object"),
            (handle.post_json("get_action", {"episode_id": "nope", "obs": good_obs}), 400, "unknown episode 'nope'"),
            (handle.post_json("get_action", {"episode_id": eid, "obs": {"a0": [1.0, 2.0]}}), 400, "shape (2,)"),
            (handle.post_json("get_action", {"episode_id": eid, "obs": {"zz": [1, 2, 3]}}), 400, "unknown agent 'zz'"),
            (handle.post_json("get_action", {"episode_id": eid, "obs": {"a0": ["a", "b", "c"]}}), 400, "numbers"),
            (handle.post_json("log_action", {"episode_id": eid, "obs": good_obs, "actions": {"a0": 9}}), 400, "outside"),
            (handle.post_json("log_returns", {"episode_id": eid, "rewards": {"a0": "NaN"}}), 400, "finite"),
            (handle.post_json("get_action", {"episode_id": eid, "obs": good_obs, "pad": "x" * 5000}), 413, "limit"),
            (handle.request("POST", "/v1/get_action", b"{}", {"Content-Type": "text/plain"}), 415, "Content-Type"),
            (handle.request("POST", "/v1/get_action"), 415, "Content-Type"),
            (handle.request("POST", "/v1/nothing", b"{}", {"Content-Type": codec.JSON}), 404, "no endpoint"),
            (handle.request("GET", "/v1/get_action"), 405, "does not take GET"),
            (handle.request("GET", "/elsewhere"), 404, "under /v1/"),
        ]
        for (status, answer), expected_status, message in cases:
            assert status == expected_status, answer
            assert message in answer["error"], answer
        # The episode is untouched by the refused requests and plays on, over plain JSON.
        status, answer = handle.post_json("get_action", {"episode_id": eid, "obs": good_obs})
        assert status == 200 and set(answer["actions"]) == {"a0"}
        assert handle.post_json("end_episode", {"episode_id": eid, "obs": good_obs})[0] == 200
        wait_for(lambda: len(handle.batches) == 1)
        assert handle.request("GET", "/v1/health")[1]["ok"] is True


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_payloads_are_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"episode_id": _Exploit(str(marker)), "obs": {}})
    with served() as handle:
        for content_type in (codec.BINARY, "application/octet-stream", "application/python-pickle"):
            status, answer = handle.request("POST", "/v1/start_episode", payload, {"Content-Type": content_type})
            assert status in (400, 415), answer
        assert handle.request("GET", "/v1/health")[0] == 200
    assert not marker.exists()


def test_token_is_required_when_set_and_for_public_addresses():
    with EnvRunner(serve_config()) as runner, pytest.raises(ServerSetupError, match="shared token"):
        PolicyServer(runner, "0.0.0.0", 0)
    with served(token="s3cret") as handle:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, answer = handle.request("GET", "/v1/health", headers=headers)
            assert status == 401 and "token" in answer["error"]
        with pytest.raises(PolicyServerError, match="401"):
            PolicyClient(handle.server.address).start_episode()
        with PolicyClient(handle.server.address, token="s3cret") as client:
            played = play_from_threads(client, num_threads=1, episodes=1)
        wait_for(lambda: len(handle.batches) == 1)
        assert totals(handle.batches) == played_totals(played)


CLIENT_THAT_DIES = """
import sys, numpy as np
from marl_runner.client import PolicyClient
client = PolicyClient(sys.argv[1])
eid = client.start_episode()
client.get_action(eid, {"a0": np.zeros(3, np.float32)})
print(eid, flush=True)
sys.stdin.read()  # wait to be killed
"""


def test_client_killed_mid_episode_costs_one_faulty_episode():
    with served(serve_config(external_episode_timeout_s=0.5)) as handle:
        dying = subprocess.Popen(
            [sys.executable, "-c", CLIENT_THAT_DIES, handle.server.address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            eid = dying.stdout.readline().strip()
            assert eid
        finally:
            dying.kill()
            dying.wait(10)
            dying.stdin.close()
            dying.stdout.close()
        # Another client vanishes halfway through sending a request.
        with socket.create_connection(handle.server.server_address_tuple(), timeout=5) as raw:
            raw.sendall(b"POST /v1/get_action HTTP/1.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 500\r\n\r\n{\"episode_id\":")
        runner = handle.server.runner
        wait_for(lambda: any(getattr(o, "episode_faulty", False) for o in handle.outputs))
        status, answer = handle.post_json("get_action", {"episode_id": eid, "obs": {"a0": [0, 0, 0]}})
        assert status == 400 and "timed out" in answer["error"]
        with PolicyClient(handle.server.address) as client:
            played = play_from_threads(client, num_threads=2, episodes=1)
        wait_for(lambda: len(handle.batches) == 2)
        assert totals(handle.batches) == played_totals(played)
        assert runner.get_metrics()["num_faulty_episodes"] == 1


def test_stopping_the_server_unblocks_waiting_clients():
    errors: list = []
    with served() as handle:
        client = PolicyClient(handle.server.address)
        eid = client.start_episode()
        handle.server.runner.env.board.stop("test: the server shuts down")

        def call() -> None:
            try:
                client.get_action(eid, {"a0": np.zeros(3, np.float32)})
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(10)
        client.close()
    assert len(errors) == 1 and isinstance(errors[0], PolicyServerError)
    assert errors[0].status == 503 and "shuts down" in str(errors[0])
