"""`Expect: 100-continue` is answered only once the request's head passed every check.

`BaseHTTPRequestHandler` sent "100 Continue" from `parse_request`, before
`do_POST` ran: a client with a wrong or missing token, or a body too big or
for no endpoint, was invited to upload it. Now a refused request gets its
error status and `Connection: close` instead, and its body is never read.
"""

from __future__ import annotations

import json
import socket

import pytest

from marl_runner.serving import codec, http_app
from tests.test_serving_http import served

TOKEN = "secret"
BODY = b"{}"


def send_head(sock: socket.socket, path: str = "/v1/start_episode", *, method: str = "POST",
              token: str | None = TOKEN, length: int = len(BODY), content_type: str = codec.JSON,
              extra: str = "") -> None:
    """A request line and headers with `Expect: 100-continue`, and no body (yet)."""
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    sock.sendall((f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {content_type}\r\n"
                  f"Content-Length: {length}\r\nExpect: 100-continue\r\n{extra}\r\n").encode())


def read_response(reader) -> tuple[str, dict[str, str], bytes]:
    """One response: its status line, headers (lower-case names) and body."""
    status = reader.readline().decode().strip()
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers.get("content-length", 0)))


REFUSALS = [
    pytest.param({"token": "wrong"}, "401", id="wrong-token"),
    pytest.param({"token": None}, "401", id="no-token"),
    pytest.param({"path": "/v1/nothing"}, "404", id="no-endpoint"),
    pytest.param({"path": "/elsewhere"}, "404", id="outside-the-api"),
    pytest.param({"path": "/v1/info"}, "405", id="get-only-endpoint"),
    pytest.param({"content_type": "text/plain"}, "415", id="content-type"),
    pytest.param({"length": 10_000}, "413", id="too-large"),
    pytest.param({"extra": "Transfer-Encoding: chunked\r\n"}, "400", id="chunked-and-length"),
]


@pytest.fixture(autouse=True)
def _short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused request's connection closes once the server stops reading its body for
    good (`LINGER_S`, 2 s): waited for here by each test, so shortened."""
    monkeypatch.setattr(http_app, "LINGER_S", 0.2)


@pytest.mark.parametrize(("head", "status"), REFUSALS)
def test_a_refused_head_gets_its_status_instead_of_100_continue_and_no_body_is_read(head, status):
    with served(token=TOKEN, max_body_bytes=1000) as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=5) as sock, sock.makefile("rb") as reader:
            send_head(sock, **head)
            # The body is never sent: the answer comes all the same, and the connection ends.
            line, headers, body = read_response(reader)
            assert line.startswith((f"HTTP/1.1 {status} ", f"HTTP/1.0 {status} ")), (line, body)
            assert headers.get("connection") == "close" or line.startswith("HTTP/1.0 ")
            assert reader.read() == b""  # closed: the server is not waiting for a body


def test_a_good_request_gets_100_continue_then_its_answer_on_a_connection_kept_alive():
    with served(token=TOKEN) as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=5) as sock, sock.makefile("rb") as reader:
            send_head(sock)
            assert read_response(reader) == ("HTTP/1.1 100 Continue", {}, b"")
            sock.sendall(BODY)
            line, headers, body = read_response(reader)
            assert line == "HTTP/1.1 200 OK" and "episode_id" in json.loads(body), (line, body)
            assert headers.get("connection") != "close"
            # A GET with the header has no body to invite: answered at once.
            sock.sendall(f"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                         "\r\nExpect: 100-continue\r\n\r\n".encode())
            line, _, body = read_response(reader)
            assert line == "HTTP/1.1 200 OK" and json.loads(body)["ok"] is True, (line, body)


def test_a_request_after_closing_began_gets_503_instead_of_100_continue():
    with served(token=TOKEN) as handle:
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=5) as sock, sock.makefile("rb") as reader:
            handle.server.closing = True  # as `close()` begins: every new request gets 503
            try:
                send_head(sock)
                line, headers, _ = read_response(reader)
            finally:
                handle.server.closing = False
            assert line.startswith("HTTP/1.1 503 "), line
            assert headers["connection"] == "close"
            assert reader.read() == b""
