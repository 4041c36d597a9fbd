"""Edges of the slow-client hardening that an adversary reaches without a token or a body.

Silent connections must not take the server's file descriptors; a GET must
not smuggle a second request in a body the server never reads; an answer the
client stops reading counts as a missed deadline like a slow request.
"""

from __future__ import annotations

import logging
import select
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from marl_runner.serving.http_linger import MAX_LINGERING
from marl_runner.serving.http_pool import PooledHTTPServer, parking_room
from tests.test_serving_http import served, wait_for

LIMITS = {"max_workers": 2, "idle_timeout_s": 0.6, "request_timeout_s": 1.0}

# A server whose process may open 128 files, probing every 20 ms that it can still open one;
# it prints its port, and stops when its stdin closes.
FD_LIMITED_SERVER = r"""
import os, resource, sys, threading, time
from http.server import BaseHTTPRequestHandler
from marl_runner.serving.http_pool import PooledHTTPServer

class Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass

resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
server = PooledHTTPServer(("127.0.0.1", 0), Ok, 2, idle_timeout_s=1.0)
threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
stdin_closed = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stdin_closed.set()), daemon=True).start()
print(server.server_address[1], flush=True)
while not stdin_closed.wait(0.02):
    try:
        os.close(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        print("cannot open a file:", exc, flush=True)
        os._exit(1)
server.shutdown()
server.server_close()
"""


def test_silent_connections_leave_the_server_room_to_open_files():
    # 150 silent connections against an open-file limit of 128 (the usual limit is 1,024 and
    # up to 1,024 were parked): the server ran out of descriptors and aborted.
    child = subprocess.Popen([sys.executable, "-c", FD_LIMITED_SERVER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    silent: list[socket.socket] = []
    try:
        port = int(child.stdout.readline())
        for _ in range(150):
            try:
                silent.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break  # the server died: its exit code says why
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # served once silent ones expire
            assert sock.makefile("rb").readline() == b"HTTP/1.1 200 OK\r\n"
    finally:
        for sock in silent:
            sock.close()
        out, _ = child.communicate(timeout=30)
    assert child.returncode == 0, out


def test_parking_room_keeps_half_the_open_file_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert parking_room(1024, 64) == 1024 // 2 - 64 - MAX_LINGERING - 1
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert parking_room(1024, 64) == 1024
    monkeypatch.setattr(resource, "getrlimit", lambda _: (64, 64))
    assert parking_room(1024, 64) == 1  # a tiny limit still parks one connection


def answers_on(address: tuple[str, int], data: bytes) -> bytes:
    """Everything the server sends back on one connection after `data`, until it closes or
    goes quiet for 2 s."""
    with socket.create_connection(address, timeout=2) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
        return received


@pytest.mark.parametrize("framing", ["Content-Length: {n}", "Transfer-Encoding: chunked"])
def test_a_get_with_a_body_is_refused_and_its_body_never_read_as_a_request(framing):
    # The body of a GET was left on the connection and read as the next request: behind a
    # proxy that forwards it as a body, a client could smuggle requests (here: /v1/info).
    inner = b"GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n"
    body = inner if "Length" in framing else b"%x\r\n%s\r\n0\r\n\r\n" % (len(inner), inner)
    head = ("GET /v1/health HTTP/1.1\r\nHost: x\r\n" + framing.format(n=len(inner)) + "\r\n\r\n")
    with served(**LIMITS) as handle:
        received = answers_on(handle.server.server_address_tuple(), head.encode() + body)
        assert received.startswith(b"HTTP/1.1 400 "), received[:200]
        assert received.count(b"HTTP/1.1 ") == 1, received
        assert b"Connection: close" in received
        assert b"a GET takes no body" in received


def test_a_get_with_an_empty_body_is_served_on_a_kept_alive_connection():
    head = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    with served(**LIMITS) as handle:
        received = answers_on(handle.server.server_address_tuple(), head * 2)
        assert received.count(b"HTTP/1.1 200 OK\r\n") == 2, received


def test_an_answer_the_client_stops_reading_counts_and_logs_as_a_missed_deadline(caplog):
    caplog.set_level(logging.INFO, logger="marl_runner.serving.http_handler")
    with served(**LIMITS, min_body_rate=1000) as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            # 3,000 pipelined /v1/info answers (1.6 KB each) fill both sides' buffers; none is
            # read.
            sock.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n" * 3000)
            wait_for(lambda: handle.server.requests_timed_out == 1)
            time.sleep(0.2)  # a second count would come at once, from the same answer
        assert handle.server.requests_timed_out == 1
        missed = [r for r in caplog.records if "missed its deadline" in r.getMessage()]
        assert len(missed) == 1


def test_a_post_with_any_transfer_encoding_header_gets_411_not_read_by_content_length():
    # Only the first Transfer-Encoding header was looked at: "identity" then "chunked" was read
    # by Content-Length here, while a proxy honouring the last one reads it chunked.
    body = b'{"episode_id": "x"}'
    head = (b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with served(**LIMITS) as handle:
        received = answers_on(handle.server.server_address_tuple(), head + body)
        assert received.startswith(b"HTTP/1.1 411 "), received[:200]
        assert b"Transfer-Encoding" in received


def test_a_post_with_two_different_content_lengths_gets_411():
    # The first one was used; a proxy in front may use the last, and see another request.
    body = b'{}{"episode_id": "x"}'
    head = (b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nContent-Length: %d\r\n\r\n" % len(body))
    with served(**LIMITS) as handle:
        received = answers_on(handle.server.server_address_tuple(), head + body)
        assert received.startswith(b"HTTP/1.1 411 "), received[:200]
        assert received.count(b"HTTP/1.1 ") == 1, received


class _HeldHandler(BaseHTTPRequestHandler):
    """Answers after `release` is set, so a test can keep the only worker busy."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def do_GET(self) -> None:
        self.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _QuietPool(PooledHTTPServer):
    """The clients close with answers unread (a reset): expected here, not worth a traceback."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


def test_shutdown_returns_at_once_while_the_accept_loop_waits_for_room_to_park():
    # The only worker busy, one request waiting for it, the one parking slot taken by a silent
    # connection, and one more connection accepted: the accept loop waited for a worker to
    # free and the silent one to expire (30 s here) before `shutdown` could return.
    _HeldHandler.release.clear()
    server = _QuietPool(("127.0.0.1", 0), _HeldHandler, 1, idle_timeout_s=30, max_parked=1)
    loop = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                            daemon=True)
    loop.start()
    address = server.server_address[:2]
    clients = [socket.create_connection(address, timeout=10) for _ in range(2)]
    try:
        for client in clients:  # the first takes the worker, the second waits for it
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: server.saturated)
        for _ in range(2):  # parked (silent), then accepted with no room to park it
            clients.append(socket.create_connection(address, timeout=10))
        wait_for(lambda: not select.select([server.socket], [], [], 0)[0])  # both accepted
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        began = time.monotonic()
        stopper.start()
        stopper.join(5)
        assert not stopper.is_alive(), "shutdown waited for room to park a connection"
        assert time.monotonic() - began < 3
    finally:
        _HeldHandler.release.set()
        server.server_close()
        loop.join(10)
        for client in clients:
            client.close()


@pytest.mark.parametrize("setting", ["max_workers", "max_parked", "max_connections_per_client"])
def test_worker_parking_and_per_client_counts_below_1_are_refused_naming_the_value(setting):
    with pytest.raises(ValueError, match=f"{setting} 0: expected an int >= 1"):
        PooledHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, **{"max_workers": 1,
                                                                      setting: 0})
