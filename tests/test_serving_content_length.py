"""Content-Length is read as RFC 9110 says (ASCII digits only), before and after `close()`.

A lenient parse (`int()` takes "+2", "1_0", "²" is a digit to `str.isdigit`)
lets the server read a body of a different length than a proxy in front of
it would, and a header `isdigit` accepts but `int` does not made the
stopping server drop the connection without an answer.
"""

from __future__ import annotations

import http.client
import socket

import pytest

from marl_runner import EnvRunner
from marl_runner.serving.server import PolicyServer
from tests.test_serving_http import serve_config


def exchange(server: PolicyServer, length: bytes, body: bytes, sock=None) -> bytes:
    """Sends one raw POST declaring `length`; returns the status line (b"" if none came)."""
    own = sock is None
    sock = sock or socket.create_connection(server.server_address_tuple(), timeout=10)
    try:
        sock.sendall(b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + length
                     + b"\r\n\r\n" + body)
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply.split(b"\r\n")[0]
    finally:
        if own:
            sock.close()


@pytest.mark.parametrize("length", [b"+2", b"0_2", b"\xb2"])
def test_a_content_length_of_other_than_ascii_digits_gets_400_before_the_body_is_read(length):
    with EnvRunner(serve_config()) as runner:
        server = PolicyServer(runner, "127.0.0.1", 0).start()
        try:
            assert exchange(server, length, b"{}").split(b" ")[1] == b"400"
            assert exchange(server, b"2", b"{}").split(b" ")[1] == b"200"
        finally:
            server.close(timeout_s=0)


@pytest.mark.parametrize("length", [b"2", b"99999999999"])
def test_the_stopping_server_answers_503_whatever_the_content_length(length):
    with EnvRunner(serve_config()) as runner:
        server = PolicyServer(runner, "127.0.0.1", 0).start()
        kept_alive = http.client.HTTPConnection(*server.server_address_tuple(), timeout=10)
        try:
            kept_alive.request("GET", "/v1/health")
            response = kept_alive.getresponse()
            response.read()
            assert response.status == 200  # a worker now holds the connection
            server.close(timeout_s=0)
            # Nothing is run: a 503, or the idle connection already closed (or reset) by the
            # shutdown.
            try:
                answer = exchange(server, length, b"{}", kept_alive.sock)
            except ConnectionResetError:
                answer = b""
            assert answer.split(b" ")[1:2] in ([b"503"], [])
        finally:
            kept_alive.close()
