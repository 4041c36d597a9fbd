"""Edges an adversary reaches without a token or a body.

A GET must not smuggle a second request in a body the server never reads; a
body framed two ways (or with two lengths) is refused, never read by one of
them; an answer the client stops reading counts as a missed deadline like a
slow request.
"""

from __future__ import annotations

import logging
import socket
import time

import pytest

from tests.test_serving_http import served, wait_for

LIMITS = {"idle_timeout_s": 0.6, "request_timeout_s": 1.0}


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
    caplog.set_level(logging.INFO, logger="marl_runner.serving.http_app")
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


def test_a_post_with_any_transfer_encoding_header_gets_a_4xx_not_read_by_content_length():
    # Only the first Transfer-Encoding header was looked at: "identity" then "chunked" was read
    # by Content-Length here, while a proxy honouring the last one reads it chunked.
    body = b'{"episode_id": "x"}'
    head = (b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with served(**LIMITS) as handle:
        received = answers_on(handle.server.server_address_tuple(), head + body)
        assert received.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), received[:200]
        assert received.count(b"HTTP/1.") == 1 and b"Transfer-Encoding" in received, received


def test_a_post_with_two_different_content_lengths_gets_a_4xx():
    # The first one was used; a proxy in front may use the last, and see another request.
    body = b'{}{"episode_id": "x"}'
    head = (b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nContent-Length: %d\r\n\r\n" % len(body))
    with served(**LIMITS) as handle:
        received = answers_on(handle.server.server_address_tuple(), head + body)
        assert received.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), received[:200]
        assert received.count(b"HTTP/1.") == 1, received
