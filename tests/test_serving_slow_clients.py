"""Slow clients (slowloris) cannot hold the policy server's workers: a request must arrive
within a deadline, not just within an idle timeout per received byte.

Each byte a client sends used to reset the socket's idle timeout, so clients
dripping one byte at a time held every worker for as long as they liked.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from marl_runner.serving import codec
from marl_runner.serving.http_deadlines import DeadlineWriter
from marl_runner.serving.http_pool import PooledHTTPServer
from tests.test_serving_http import served, wait_for

# Small limits keep each test to a few seconds: the drip interval is well under the idle
# timeout, so only a deadline for the whole request can end a dripping client.
LIMITS = {"max_workers": 2, "idle_timeout_s": 0.6, "request_timeout_s": 1.0}
DRIP_EVERY_S = 0.1
DRIP_FOR_S = 20.0  # longer than any bound below: without a deadline the drippers never end
NORMAL_CLIENT_TIMEOUT_S = 8.0


class Dripper:
    """One connection sending `head` at once, then `drip` one byte every `DRIP_EVERY_S`,
    until the server closes it (or `DRIP_FOR_S` passed, or `stop` is set)."""

    def __init__(self, address: tuple[str, int], head: bytes, drip: bytes, stop: threading.Event):
        self.sock = socket.create_connection(address, timeout=5)
        self.sock.sendall(head)
        self.drip, self.stop = drip, stop
        self.answer = b""
        self.closed_after_s: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        began = time.monotonic()
        try:
            for byte in self.drip:
                if self.stop.wait(DRIP_EVERY_S) or time.monotonic() - began > DRIP_FOR_S:
                    return
                if select.select([self.sock], [], [], 0)[0]:
                    break  # the server answered or closed
                self.sock.sendall(bytes([byte]))
            self.sock.settimeout(5)
            while chunk := self.sock.recv(4096):
                self.answer += chunk
        except OSError:
            pass  # reset by the server's close: closed as well
        self.closed_after_s = time.monotonic() - began

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


def run_slow_clients(handle: Any, head: bytes, drip: bytes) -> tuple[float, list[Dripper]]:
    """`max_workers` drippers take every worker; returns how long a normal GET then took."""
    httpd = handle.server._httpd
    stop = threading.Event()
    address = handle.server.server_address_tuple()
    drippers = [Dripper(address, head, drip, stop) for _ in range(httpd.max_workers)]
    try:
        wait_for(lambda: httpd.num_workers == httpd.max_workers)  # each holds a worker
        began = time.monotonic()
        connection = http.client.HTTPConnection(*address, timeout=NORMAL_CLIENT_TIMEOUT_S)
        try:
            connection.request("GET", "/v1/health")
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read())["ok"] is True
        finally:
            connection.close()
        took = time.monotonic() - began
        for dripper in drippers:
            dripper.thread.join(10)
    finally:
        stop.set()
        for dripper in drippers:
            dripper.close()
    return took, drippers


def test_header_drippers_on_every_worker_cannot_starve_a_normal_client(caplog):
    caplog.set_level(logging.INFO, logger="marl_runner.serving.http_handler")
    head = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: "
    with served(**LIMITS) as handle:
        took, drippers = run_slow_clients(handle, head, b"a" * 1000)
        assert took < 5.0, f"a normal request waited {took:.1f} s behind slow clients"
        for dripper in drippers:
            assert dripper.closed_after_s is not None and dripper.closed_after_s < 5.0
            assert dripper.answer.startswith(b"HTTP/1.1 408 "), dripper.answer[:200]
            assert b"Connection: close" in dripper.answer
        assert handle.server.requests_timed_out == len(drippers)  # once per request
        missed = [r for r in caplog.records if "missed its deadline" in r.getMessage()]
        assert len(missed) == len(drippers)  # logged once each, not per byte
        assert handle.request("GET", "/v1/health")[0] == 200


def test_body_drippers_on_every_worker_cannot_starve_a_normal_client_or_hold_memory():
    # 1,000 body bytes at a minimum of 1,000 bytes/s: the body's deadline is 1 s + 1 s.
    head = (b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    with served(**LIMITS, min_body_rate=1000) as handle:
        took, drippers = run_slow_clients(handle, head, b" " * 1000)
        assert took < 6.0, f"a normal request waited {took:.1f} s behind slow uploads"
        for dripper in drippers:
            assert dripper.closed_after_s is not None and dripper.closed_after_s < 6.0
            assert dripper.answer.startswith(b"HTTP/1.1 408 "), dripper.answer[:200]
        assert handle.server.body_budget.in_flight == 0  # their reservations were given back
        assert handle.server.requests_timed_out == len(drippers)


def test_a_trickled_body_is_cut_off_after_the_floor_however_big_it_claims_to_be():
    # 10 MB declared: a deadline for the whole body would be 1 s + 160 s at 64 KiB/s, and the
    # reservation in the memory budget (60 MB each) would be held all that time.
    head = (b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n")
    with served(**LIMITS) as handle:
        took, drippers = run_slow_clients(handle, head, b" " * 1000)
        assert took < 6.0, f"a normal request waited {took:.1f} s behind slow uploads"
        for dripper in drippers:
            assert dripper.closed_after_s is not None and dripper.closed_after_s < 6.0
            assert dripper.answer.startswith(b"HTTP/1.1 408 "), dripper.answer[:200]
        assert handle.server.body_budget.in_flight == 0


def test_a_big_body_slower_than_the_floor_but_above_the_minimum_rate_is_accepted():
    # 2 MiB sent over about 1 s in 64 KiB pieces: past the 1 s head start, but always ahead
    # of 256 KiB/s after it.
    body = json.dumps({"pad": "x" * (2 << 20)}).encode()
    with served(**LIMITS, min_body_rate=256 * 1024) as handle:
        sock = socket.create_connection(handle.server.server_address_tuple(), timeout=10)
        with sock:
            sock.sendall(b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         + codec.JSON.encode() + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n")
            for offset in range(0, len(body), 1 << 16):
                time.sleep(0.03)
                sock.sendall(body[offset:offset + (1 << 16)])
            status_line = sock.makefile("rb").readline()
        assert status_line == b"HTTP/1.1 200 OK\r\n", status_line
        assert handle.server.requests_timed_out == 0


def status_of_head(address: tuple[str, int], pad_headers: int) -> bytes:
    """The status line answering a GET with `pad_headers` headers of 4,000 bytes each."""
    pads = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 4000) for i in range(pad_headers))
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" + pads + b"\r\n")
        return sock.makefile("rb").readline()


def test_a_head_over_64_kib_gets_431_and_one_under_it_is_served():
    # http.server alone takes 100 lines of 64 KiB: 6.5 MB held per connection, outside the
    # memory budget for bodies.
    with served(**LIMITS) as handle:
        address = handle.server.server_address_tuple()
        assert status_of_head(address, 20) == b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        assert status_of_head(address, 12) == b"HTTP/1.1 200 OK\r\n"


def test_keep_alive_requests_each_get_their_own_deadline():
    with served(**LIMITS) as handle:
        connection = http.client.HTTPConnection(*handle.server.server_address_tuple(), timeout=10)
        try:
            for _ in range(3):  # idle between requests, under the idle timeout each time
                time.sleep(0.4)
                connection.request("GET", "/v1/health")
                response = connection.getresponse()
                assert response.status == 200 and response.getheader("Connection") is None
                response.read()
        finally:
            connection.close()
        assert handle.server.requests_timed_out == 0


@pytest.mark.parametrize(
    ("setting", "value"),
    [("request_timeout_s", 0), ("request_timeout_s", float("inf")), ("min_body_rate", -5),
     ("min_body_rate", "64k"), ("idle_timeout_s", 0), ("idle_timeout_s", -1.0)],
)
def test_bad_deadline_settings_are_refused_naming_the_value(setting, value):
    with pytest.raises(ValueError, match=f"{setting} {value!r}: expected a finite number > 0"):
        PooledHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, 1, **{setting: value})


def test_an_answer_the_client_does_not_read_times_out_after_the_floor_however_big():
    server_side, client_side = socket.socketpair()
    with server_side, client_side:
        server_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        writer = DeadlineWriter(server_side, request_timeout_s=0.3, min_body_rate=1 << 20)
        began = time.monotonic()
        # 50 MB at 1 MiB/s would be allowed ~48 s as a whole; the client reads nothing.
        with pytest.raises(TimeoutError):
            writer.write(bytes(50_000_000))
        assert time.monotonic() - began < 3.0
