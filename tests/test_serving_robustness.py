"""Serving failure paths: every waiting client gets an answer at once, nothing is left open."""

from __future__ import annotations

import http.client
import io
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from helpers_http_stub import serving_on_loopback

from marl_runner import EnvRunner
from marl_runner.cli import main
from marl_runner.serving import codec
from marl_runner.serving import server as server_module
from marl_runner.serving.server import PolicyServer
from marl_runner.serving.state_sync import StateSync
from marl_runner.serving.transport import HttpTransport
from tests.test_serving_http import serve_config, wait_for

SERVE_DRONES = Path(__file__).resolve().parents[1] / "examples" / "configs" / "serve_drones.yaml"


def _waiting_exchanges(sync: StateSync, count: int) -> tuple[list[threading.Thread], list]:
    """`count` weight syncs queued in threads; each appends what it raised or returned."""
    results: list = []

    def exchange() -> None:
        try:
            results.append(sync.exchange({}, timeout_s=30))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=exchange, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(sync._pending) == count)
    return threads, results


@pytest.mark.parametrize("failing", ["get_state", "encode"])
def test_a_failing_snapshot_answers_every_waiting_weight_sync_at_once(monkeypatch, failing):
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    with EnvRunner(serve_config()) as runner:
        if failing == "get_state":
            monkeypatch.setattr(runner, "get_state", broken)
        else:
            monkeypatch.setattr(codec, "encode", broken)
        sync = StateSync()
        threads, results = _waiting_exchanges(sync, 2)
        with pytest.raises(OSError, match="disk gone"):
            sync.refresh(runner)  # the sampling loop still sees its own error
        for thread in threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in threads), "a client waits for its timeout"
        assert len(results) == 2 and all(type(r) is RuntimeError for r in results), results
        assert all("OSError: disk gone" in str(r) for r in results), results


@pytest.mark.parametrize("authorization", [None, "Bearer wrong"])
def test_a_stopping_server_reads_no_body_of_an_unauthorized_request(monkeypatch, authorization):
    with EnvRunner(serve_config()) as runner:
        # A long idle timeout: reading the body that never comes would outlast the client's wait.
        server = PolicyServer(runner, "127.0.0.1", 0, token="secret", idle_timeout_s=60).start()
        try:
            server.closing = True  # as once close() began: every request gets 503
            host, port = server.server_address_tuple()
            connection = http.client.HTTPConnection(host, port, timeout=10)
            connection.putrequest("POST", "/v1/experiences")
            connection.putheader("Content-Type", codec.JSON)
            connection.putheader("Content-Length", "1000")  # declared, never sent
            if authorization is not None:
                connection.putheader("Authorization", authorization)
            connection.endheaders()
            response = connection.getresponse()
            answer = codec.decode(response.read(), codec.JSON)
            connection.close()
        finally:
            server.close(timeout_s=0)
        assert (response.status, response.getheader("Connection")) == (503, "close")
        assert answer["type"] == "ExternalEnvStopped", answer


class _ClosesWhileIdle(BaseHTTPRequestHandler):
    """Answers 200 as keep-alive (no `Connection: close`), then closes the connection at once."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        _ClosesWhileIdle.seen.append(f"{self.command} {self.path}")
        payload = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", codec.JSON)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def closes_while_idle() -> Iterator[str]:
    _ClosesWhileIdle.seen = []
    with serving_on_loopback(_ClosesWhileIdle) as address:
        yield address


def test_a_kept_alive_connection_the_server_closed_while_idle_is_not_reused_even_with_retries_0():
    with closes_while_idle() as address:
        transport = HttpTransport(address, timeout_s=10, retries=0)
        try:
            assert transport.get("health") == {"ok": True}
            for _ in range(2):  # the server closed the last connection: a fresh one is opened
                time.sleep(0.1)
                assert transport.post("log_returns", {"a": 1.0}) == {"ok": True}
        finally:
            transport.close()
        assert _ClosesWhileIdle.seen == ["GET /v1/health"] + ["POST /v1/log_returns"] * 2


class _ClosedPipe(io.StringIO):
    """Standard output whose reader went away (`marl-runner serve | head`, then head exits).

    rich then points the file descriptor at /dev/null and raises SystemExit:
    `fd` is a scratch file's, so the test's own output is untouched.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self.fd


def test_serve_closes_the_server_when_announcing_it_fails(monkeypatch, tmp_path):
    built: list[server_module.PolicyServer] = []

    class Recorded(server_module.PolicyServer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(server_module, "PolicyServer", Recorded)
    stdout = sys.stdout
    with open(tmp_path / "stdout", "w") as scratch:  # open throughout: its fd is not reused
        monkeypatch.setattr(sys, "stdout", _ClosedPipe(scratch.fileno()))
        try:
            with pytest.raises(SystemExit):
                main(["serve", str(SERVE_DRONES), "--port", "0"])
        finally:
            monkeypatch.setattr(sys, "stdout", stdout)
            left_open = [server for server in built if not server.closing]
            for server in left_open:
                server.close(timeout_s=0)
    assert len(built) == 1 and not left_open, "the server was left open"
    host, port = built[0].server_address_tuple()
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection(host, port, timeout=10).connect()
