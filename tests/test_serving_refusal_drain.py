"""A refusal answered before the body was read still reaches a client that sends the body.

Closing a socket with unread bytes resets the connection: a client still
sending its body fails on the send and never reads the answer. So a body
never invited (`Expect: 100-continue` refused for lack of memory budget, or
by a closing server), and a connection over its client's cap, are answered,
half-closed and drained for a bounded time before they close. A request with
no body for a path no endpoint takes keeps its connection.
"""

from __future__ import annotations

import http.client
import json
import select
import selectors
import socket
import threading

import numpy as np
import pytest

from marl_runner.serving import codec
from marl_runner.serving.http_linger import Lingering
from marl_runner.serving.transport import HttpTransport
from tests.test_serving_expect_continue import (
    connected_with_full_budget,
    read_response,
    send_head,
)
from tests.test_serving_http import served, wait_for

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
def test_an_uninvited_body_sent_anyway_still_reads_the_503_for_no_room(monkeypatch, at_once):
    with connected_with_full_budget(monkeypatch, timeout=10) as (sock, reader):
        send_head(sock, length=BIG)
        line, headers, body = send_body_anyway(sock, reader, at_once)
        assert line.startswith("HTTP/1.1 503 "), (line, body)
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        assert "retry in a moment" in json.loads(body)["error"]
        assert reader.read() == b""  # the body was drained: an end, not a reset


@pytest.mark.parametrize("at_once", [True, False], ids=["sent-at-once", "sent-after-the-503"])
def test_an_uninvited_body_sent_anyway_still_reads_the_503_of_a_closing_server(at_once):
    with served(token=TOKEN) as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=10) as sock, sock.makefile("rb") as reader:
            handle.server._closing = True  # as `close()` begins: every new request gets 503
            try:
                send_head(sock, length=BIG)
                line, headers, body = send_body_anyway(sock, reader, at_once)
            finally:
                handle.server._closing = False
            assert line.startswith("HTTP/1.1 503 "), (line, body)
            assert json.loads(body)["type"] == "ExternalEnvStopped"
            assert headers["connection"] == "close"
            assert reader.read() == b""


def test_a_big_post_over_the_connection_cap_reads_its_503_and_the_socket_is_let_go():
    with served(max_connections_per_client=1, idle_timeout_s=30) as handle:
        connections = handle.server.client_connections
        host, port = handle.server.server_address_tuple()
        with socket.create_connection((host, port), timeout=10):
            wait_for(lambda: connections.open_from("127.0.0.1") == 1)
            for attempt in range(5):  # a reset used to fail nearly every one
                client = http.client.HTTPConnection(host, port, timeout=10)
                try:
                    client.request("POST", "/v1/start_episode", body=big_body(2 << 20),
                                   headers={"Content-Type": codec.JSON})
                    response = client.getresponse()
                    assert response.status == 503, (attempt, response.status)
                    assert response.getheader("Retry-After") == "1"
                    assert "connections open" in json.loads(response.read())["error"]
                finally:
                    client.close()
            assert connections.refused == 5
            lingering = handle.server._httpd.lingering
            wait_for(lambda: lingering.num_lingering == 0)  # each closed after its client


def test_a_client_over_the_cap_waits_and_retries_until_a_slot_frees():
    with served(max_connections_per_client=1, idle_timeout_s=30) as handle:
        connections = handle.server.client_connections
        address = handle.server.server_address_tuple()
        silent = socket.create_connection(address, timeout=10)
        wait_for(lambda: connections.open_from("127.0.0.1") == 1)

        def free_the_slot_after_a_refusal() -> None:
            try:
                wait_for(lambda: connections.refused >= 1)
            finally:
                silent.close()

        freer = threading.Thread(target=free_the_slot_after_a_refusal, daemon=True)
        freer.start()
        # `PolicyClient` sends every call through this transport; a 2 MB body, as an upload.
        transport = HttpTransport(handle.server.address, timeout_s=10, backoff_s=0.05)
        try:
            answer = transport.post("start_episode", {"pad": np.zeros(2 << 20, np.uint8)})
        finally:
            transport.close()
            freer.join(10)
        assert isinstance(answer["episode_id"], str)
        assert connections.refused >= 1


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


def test_lingering_sockets_are_capped_drained_and_closed_on_eof_or_after_linger_s():
    closed: list[socket.socket] = []
    lingering = Lingering(closed.append, max_lingering=2, linger_s=0.05)
    pairs = [socket.socketpair() for _ in range(3)]
    selector = selectors.DefaultSelector()
    try:
        (quitter, quitter_peer), (silent, _), (extra, _) = pairs
        assert lingering.offer(quitter) and lingering.offer(silent)
        assert not lingering.offer(extra)  # full: its caller closes it at once
        lingering.watch(selector)
        assert lingering.num_lingering == 2
        quitter_peer.sendall(b"x" * 100_000)
        quitter_peer.close()
        while quitter not in closed:  # drained, then closed on the client's end
            for key, _ in selector.select(timeout=5):
                assert key.data is lingering
                lingering.read(key.fileobj, selector)
        wait_for(lambda: lingering.expire(selector) or silent in closed)
        assert lingering.num_lingering == 0 and closed == [quitter, silent]
        assert lingering.offer(extra)  # their slots are free again
        lingering.close_all(selector)
        assert closed[-1] is extra and lingering.num_lingering == 0
    finally:
        selector.close()
        for pair in pairs:
            for sock in pair:
                sock.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_lingering": 0}, r"max_lingering 0: expected an int >= 1"),
    ({"linger_s": 0}, r"linger_s 0: expected a finite number > 0"),
])
def test_lingering_limits_out_of_range_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Lingering(lambda sock: None, **kwargs)
