"""PolicyClient after connection failures: fresh connections, bounded retries, clear errors."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np
import pytest
from helpers_http_stub import serving_on_loopback
from helpers_serve_process import free_port, serve_process

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.client import PolicyClient, PolicyServerError, PolicyServerUnavailable
from marl_runner.serving import codec
from marl_runner.serving.server import PolicyServer

CONFIG = {
    "env": {"name": "examples.serving_envs:DroneSwarm", "config": {"num_drones": 2}},
    "vectorize": "external",
    "num_envs": 2,
    "policies": {"pilot": {"model": {"type": "mlp", "hidden": [8]}}},
}
OBS = {f"drone_{i}": np.zeros(8, np.float32) for i in range(2)}
DRONES_OBS = {f"drone_{i}": np.zeros(8, np.float32) for i in range(4)}  # serve_drones.yaml


class Served:
    """An in-process policy server whose sampling loop can be started later."""

    def __init__(self, port: int) -> None:
        self.runner = EnvRunner(RunnerConfig.from_dict(CONFIG))
        self.server = PolicyServer(self.runner, "127.0.0.1", port).start()
        self.stop = threading.Event()
        self.loop = threading.Thread(target=self.server.serve, args=(self.stop, list), daemon=True)

    def close(self) -> None:
        self.stop.set()
        if self.loop.is_alive():
            self.loop.join(10)
        self.runner.stop()
        self.server.close()


@contextmanager
def served(port: int = 0, *, loop: bool = True) -> Iterator[Served]:
    handle = Served(port)
    if loop:
        handle.loop.start()
    try:
        yield handle
    finally:
        handle.close()


@pytest.mark.slow
def test_client_recovers_when_the_server_is_stopped_and_restarted_on_the_same_port():
    port = free_port()
    with serve_process("--port", str(port)) as first:
        client = PolicyClient(first.address, retries=2, backoff_s=0.01)
        eid = client.start_episode()
        assert set(client.get_action(eid, DRONES_OBS)) == set(DRONES_OBS)
        first.finish(signal.SIGTERM)
    # Stopped: each call is retried (nothing was sent), then names the server and the call.
    with pytest.raises(
        PolicyServerUnavailable, match=rf"{first.address}: GET /v1/health failed after 3 attempts"
    ):
        client.health()
    with pytest.raises(PolicyServerUnavailable, match=r"POST /v1/start_episode failed after 3"):
        client.start_episode()
    with serve_process("--port", str(port)) as second:
        assert second.address == first.address
        assert client.health()["ok"] is True
        eid = client.start_episode()
        assert set(client.get_action(eid, DRONES_OBS)) == set(DRONES_OBS)
        client.end_episode(eid, DRONES_OBS)
        client.close()
        second.finish(signal.SIGTERM)


def test_a_timed_out_get_action_is_not_retried_and_the_next_call_works():
    with served(loop=False) as handle:  # nobody answers get_action yet
        client = PolicyClient(handle.server.address, timeout_s=0.5, retries=3, backoff_s=0.01)
        eid = client.start_episode()
        with pytest.raises(PolicyServerUnavailable, match=r"get_action failed after the request "
                           r"was sent \(TimeoutError.*not retried"):
            client.get_action(eid, OBS)
        handle.loop.start()
        assert set(client.get_action(eid, OBS)) == set(OBS)
        client.close()


class _Stub(BaseHTTPRequestHandler):
    """Answers as `script` says, one entry per request: "drop", an int status, or 200."""

    protocol_version = "HTTP/1.1"
    script: list[Any] = []
    seen: list[str] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        step = self.script.pop(0) if self.script else 200
        if step == "drop":
            self.close_connection = True  # no answer at all
            return
        body = json.dumps({"ok": True} if step == 200 else {"error": "busy", "type": "HTTPError"})
        self.send_response(step)
        self.send_header("Content-Type", codec.JSON)
        self.send_header("Content-Length", str(len(body)))
        if step == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def stub(script: list[Any]) -> Iterator[str]:
    _Stub.script, _Stub.seen = list(script), []
    with serving_on_loopback(_Stub) as address:
        yield address


def test_get_is_retried_after_a_dropped_connection_post_is_not():
    with stub(["drop", 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        assert client.health() == {"ok": True}
        assert _Stub.seen == ["GET /v1/health"] * 2
    with stub(["drop", 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        with pytest.raises(PolicyServerUnavailable, match=r"log_returns failed after the request"):
            client.log_returns("e1", {"a": 1.0})
        assert _Stub.seen == ["POST /v1/log_returns"]
        client.log_returns("e1", {"a": 1.0})  # a fresh connection; the server answers now
        assert _Stub.seen == ["POST /v1/log_returns"] * 2


def test_503_with_retry_after_is_retried_then_reported():
    with stub([503, 503, 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        client.log_returns("e1", {"a": 1.0})
        assert len(_Stub.seen) == 3
    with stub([503] * 3) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        with pytest.raises(PolicyServerError, match="503"):
            client.log_returns("e1", {"a": 1.0})
        assert len(_Stub.seen) == 3


def test_retry_settings_are_checked():
    with pytest.raises(ValueError, match=r"retries -1: expected an int >= 0"):
        PolicyClient("http://127.0.0.1:1", retries=-1)
    with pytest.raises(ValueError, match=r"backoff_s nan: expected a number >= 0"):
        PolicyClient("http://127.0.0.1:1", backoff_s=float("nan"))
