"""A refusal answered before the body was read still reaches a client that sends the body.

Closing a socket with unread bytes resets the connection: a client still
sending its body fails on the send and never reads the answer. So a body
never invited (`Expect: 100-continue` refused by a closing server) is
answered, then read and dropped for a bounded time before the connection
closes; and the client reads an answer that came before a reset. A request
with no body for a path no endpoint takes keeps its connection.
"""

from __future__ import annotations

import json
import select
import socket
import threading

import pytest

from marl_runner.serving import codec
from marl_runner.serving.transport import HttpTransport
from tests.test_serving_expect_continue import read_response, send_head
from tests.test_serving_http import served

TOKEN = "secret"
BIG = 4 << 20  # more than the socket buffers take: a reset fails the client's send


def big_body(size: int = BIG) -> bytes:
    return b" " * (size - 2) + b"{}"


def send_body_anyway(sock: socket.socket, reader, at_once: bool) -> tuple[str, dict, bytes]:
    """Sends the body without "100 Continue" (at once, or once the refusal came, as a client
    that stopped waiting), then reads the answer; skips any interim 1xx."""
    if not at_once:
        assert select.select([sock], [], [], 10)[0], "no answer to the head within 10 s"
    sock.sendall(big_body())
    answer = read_response(reader)
    while answer[0].startswith("HTTP/1.1 1"):
        answer = read_response(reader)
    return answer


@pytest.mark.parametrize("at_once", [True, False], ids=["sent-at-once", "sent-after-the-503"])
def test_an_uninvited_body_sent_anyway_still_reads_the_503_of_a_closing_server(at_once):
    with served(token=TOKEN) as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=10) as sock, sock.makefile("rb") as reader:
            handle.server.closing = True  # as `close()` begins: every new request gets 503
            try:
                send_head(sock, length=BIG)
                line, headers, body = send_body_anyway(sock, reader, at_once)
            finally:
                handle.server.closing = False
            assert line.startswith("HTTP/1.1 503 "), (line, body)
            assert json.loads(body)["type"] == "ExternalEnvStopped"
            assert headers["connection"] == "close"
            assert reader.read() == b""


def test_the_client_reads_an_answer_sent_before_a_reset_cut_its_send():
    """A server that answers 503 and closes without reading the body resets the upload; the
    answer came first: the transport reads it and retries, as for any 503 with Retry-After."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    served_ok: list[bytes] = []

    def server() -> None:
        with listener:
            refused, _ = listener.accept()
            with refused:
                refused.settimeout(10)
                refused.recv(1024)
                refused.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                                b"application/json\r\nContent-Length: 2\r\nRetry-After: 0\r\n"
                                b"Connection: close\r\n\r\n{}")
            accepted, _ = listener.accept()  # closed with the body unread: a reset
            with accepted, accepted.makefile("rb") as reader:
                accepted.settimeout(10)
                head = b""
                while (line := reader.readline()) not in (b"\r\n", b""):
                    head += line
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                served_ok.append(reader.read(length)[-10:])
                accepted.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 12\r\n\r\n{\"ok\": true}")

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    transport = HttpTransport(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=10,
                              content_type=codec.JSON, backoff_s=0.01)
    try:
        assert transport.post("upload", {"pad": "x" * (16 << 20)}) == {"ok": True}
    finally:
        transport.close()
        thread.join(10)
    assert served_ok and not thread.is_alive()


@pytest.mark.parametrize(("request_head", "status"), [
    ("GET /v1/nothing HTTP/1.1\r\n", "404"),
    ("GET /elsewhere HTTP/1.1\r\n", "404"),
    ("GET /v1/start_episode HTTP/1.1\r\n", "405"),
    ("POST /v1/nothing HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\n",
     "404"),
])
def test_a_request_without_a_body_for_no_endpoint_keeps_its_connection(request_head, status):
    with served() as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=10) as sock, sock.makefile("rb") as reader:
            sock.sendall(f"{request_head}Host: x\r\n\r\n".encode())
            line, headers, body = read_response(reader)
            assert line.startswith(f"HTTP/1.1 {status} "), (line, body)
            assert headers.get("connection") != "close" and "error" in json.loads(body)
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            line, _, body = read_response(reader)
            assert line == "HTTP/1.1 200 OK" and json.loads(body)["ok"] is True, (line, body)


def test_a_post_with_a_body_for_no_endpoint_still_closes_its_connection():
    with served() as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=10) as sock, sock.makefile("rb") as reader:
            sock.sendall(b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: 2\r\n\r\n{}")
            line, headers, _ = read_response(reader)
            assert line.startswith("HTTP/1.1 404 ") and headers["connection"] == "close", line
