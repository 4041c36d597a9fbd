"""PolicyClient after connection failures: fresh connections, bounded retries, clear errors."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from helpers_http_stub import ScriptedHandler, scripted_server
from helpers_serve_process import REPO, free_port, serve_process

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.client import PolicyClient, PolicyServerError, PolicyServerUnavailable
from marl_runner.serving import codec
from marl_runner.serving.server import PolicyServer
from marl_runner.serving.transport import HttpTransport

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


def _calls() -> list[str]:
    return [f"{method} /v1/{name}" for method, name, _ in ScriptedHandler.requests]


def test_get_is_retried_after_a_dropped_connection_post_is_not():
    with scripted_server(ScriptedHandler, ["drop", 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        assert client.health() == {"ok": True}
        assert _calls() == ["GET /v1/health"] * 2
    with scripted_server(ScriptedHandler, ["drop", 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        with pytest.raises(PolicyServerUnavailable, match=r"log_returns failed after the request"):
            client.log_returns("e1", {"a": 1.0})
        assert _calls() == ["POST /v1/log_returns"]
        client.log_returns("e1", {"a": 1.0})  # a fresh connection; the server answers now
        assert _calls() == ["POST /v1/log_returns"] * 2


def test_a_post_on_a_reused_connection_that_closes_unanswered_is_never_sent_again():
    """libcurl on its own sends such a request again on a fresh connection: the server
    would apply it twice. A GET there is retried, as after any dropped connection."""
    with scripted_server(ScriptedHandler, [200, "drop", 200, 200, "drop", 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        client.log_returns("e1", {"a": 1.0})
        with pytest.raises(PolicyServerUnavailable, match="after the request was sent") as failed:
            client.log_returns("e1", {"a": 1.0})  # the same connection, closed unanswered
        assert failed.value.sent
        client.log_returns("e1", {"a": 1.0})  # a fresh connection
        assert _calls() == ["POST /v1/log_returns"] * 3
        assert client.health() == {"ok": True}
        assert client.health() == {"ok": True}  # dropped, then sent again: once more
        assert _calls()[3:] == ["GET /v1/health"] * 3
        client.close()


def test_a_connection_kept_for_reuse_holds_nothing_of_its_last_call():
    with scripted_server(ScriptedHandler, []) as address:
        transport = HttpTransport(address, content_type=codec.JSON)
        tracemalloc.start()
        try:
            transport.post("experiences", {"pad": "x" * (16 << 20)})
            ScriptedHandler.requests.clear()  # the stand-in server's record of the body
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(transport._idle) == 1  # kept alive for the next call
        assert held < 1 << 20  # not the 16 MB body it sent
        transport.close()


_WAITS_FOR_AN_ANSWER = """
import os, signal, socket, sys, threading, time
from marl_runner.client import PolicyClient
listener = socket.create_server(("127.0.0.1", 0))  # accepts, and never answers
client = PolicyClient(f"127.0.0.1:{listener.getsockname()[1]}")
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    client.health()
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s")
"""


def test_ctrl_c_interrupts_a_call_waiting_for_its_answer():
    done = subprocess.run([sys.executable, "-c", _WAITS_FOR_AN_ANSWER], capture_output=True,
                          text=True, timeout=10, cwd=REPO)
    assert done.stdout.startswith("interrupted after "), done.stdout + done.stderr
    assert float(done.stdout.split()[2]) < 2.0  # libcurl lets Python in at least once a second


def test_a_proxy_named_by_the_environment_is_not_used(monkeypatch):
    with scripted_server(ScriptedHandler, []) as address:
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, "http://127.0.0.1:1")  # nothing listens there
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        client = PolicyClient(address, retries=0)
        assert client.health() == {"ok": True}
        client.close()


def test_503_with_retry_after_is_retried_then_reported():
    with scripted_server(ScriptedHandler, [503, 503, 200]) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        client.log_returns("e1", {"a": 1.0})
        assert len(_calls()) == 3
    with scripted_server(ScriptedHandler, [503] * 3) as address:
        client = PolicyClient(address, retries=2, backoff_s=0.01)
        with pytest.raises(PolicyServerError, match="503"):
            client.log_returns("e1", {"a": 1.0})
        assert len(_calls()) == 3


def test_retry_settings_are_checked():
    with pytest.raises(ValueError, match=r"retries -1: expected an int >= 0"):
        PolicyClient("http://127.0.0.1:1", retries=-1)
    with pytest.raises(ValueError, match=r"backoff_s nan: expected a number >= 0"):
        PolicyClient("http://127.0.0.1:1", backoff_s=float("nan"))
    with pytest.raises(ValueError, match=r"timeout_s 0: expected a number > 0, or None"):
        PolicyClient("http://127.0.0.1:1", timeout_s=0)
