"""The HTTP side of `PolicyServer`: one request in, one `PolicyServer.call`, one answer out.

Everything that can be refused without decoding is refused here, before the
body is read: a missing token, a path that names no endpoint, an unknown
content type, a chunked, missing or oversized body, a GET with a body, a body
that finds no room in the memory budget, and any request after `close()`
began. A client that sent `Expect: 100-continue` gets "100 Continue" only
once its request passed all of these, just before its body is read; a
refused one gets its error status and `Connection: close` instead. A
request that does not arrive within its deadline (`http_deadlines`: however
slowly its bytes drip in) gets 408 and its connection ends. What the call raises
becomes a status (`STATUS_OF`) with `{"error", "type"}` in the body, so the
client can re-raise it; nothing a client sends can stop the server.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import logging
import socket
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.serving import codec
from marl_runner.serving.body_memory import READ_STEP, BodyBudget, BodyReservation
from marl_runner.serving.http_deadlines import DeadlineReader, DeadlineWriter, HeadTooLarge
from marl_runner.serving.http_pool import PooledHTTPServer, release_free_memory

logger = logging.getLogger(__name__)

API_PREFIX = "/v1/"
STOPPING_MESSAGE = "the server is stopping; this request was not run"
# Estimated peak memory per body byte while a request is decoded and checked (JSON
# numbers become Python objects; binary arrays are copied out of the body once).
JSON_MEMORY_FACTOR = 6
BINARY_MEMORY_FACTOR = 2
# After a body this big, freed memory goes back to the OS (see `release_free_memory`).
TRIM_AFTER_BYTES = 8 * 1024 * 1024

# Exception types a client re-raises as themselves (anything else: PolicyServerError).
STATUS_OF: tuple[tuple[type[BaseException], HTTPStatus], ...] = (
    (ExternalEnvStopped, HTTPStatus.SERVICE_UNAVAILABLE),
    (TimeoutError, HTTPStatus.SERVICE_UNAVAILABLE),
    (NotImplementedError, HTTPStatus.NOT_IMPLEMENTED),
    (MemoryError, HTTPStatus.SERVICE_UNAVAILABLE),
    (ValueError, HTTPStatus.BAD_REQUEST),  # RequestError, CodecError, unknown episodes
)


class HTTPStatusError(Exception):
    """A call refused with a given status (unknown endpoint, wrong method), not by its content."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class PolicyEndpoint(Protocol):
    """What the handler needs from `PolicyServer`, so this module does not import it back."""

    token: str | None
    max_body_bytes: int
    body_budget: BodyBudget
    body_wait_s: float

    def begin_request(self) -> bool:
        """Counts a request in progress, so closing waits for it; False once closing began."""

    def end_request(self) -> None:
        """Ends what `begin_request` counted, so closing stops waiting for it."""

    def route(self, method: str, name: str) -> Any:
        """The call `method /v1/name` runs, or `HTTPStatusError`: checked before any body."""

    def call(self, method: str, name: str, body: Any) -> Any:
        """Runs one API call, so the handler knows nothing of routes; `bytes` when encoded."""


class PolicyHTTPServer(PooledHTTPServer):
    """The pooled HTTP server that hands each request to its `policy_server`."""

    policy_server: PolicyEndpoint

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished mid-request is routine for a server; log it quietly.
        logger.debug("connection from %s failed", client_address, exc_info=True)


class PolicyRequestHandler(BaseHTTPRequestHandler):
    """Serves one connection's requests (HTTP/1.1 keep-alive) for `server.policy_server`."""

    protocol_version = "HTTP/1.1"
    server: PolicyHTTPServer

    def setup(self) -> None:
        """Reads and writes through deadlines: a per-recv timeout alone lets a drip go on."""
        server = self.server
        self.connection = self.request
        # Small replies: no 40 ms wait for a delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self._reader = DeadlineReader(self.connection, server.idle_timeout_s,
                                      server.request_timeout_s, server.min_body_rate)
        self.rfile = io.BufferedReader(self._reader)
        self.wfile = DeadlineWriter(self.connection, server.request_timeout_s, server.min_body_rate)

    def handle_one_request(self) -> None:
        """One request under its deadline; one that missed it is answered 408 and counted once."""
        self._answered = self._missed = self._continue_due = False
        # What a 408 needs if the request line never came (`parse_request` sets them otherwise).
        self.requestline = self.request_version = self.command = ""
        self._reader.expect_request()
        try:
            super().handle_one_request()  # a timeout in the head ends there, as a TimeoutError
        except HeadTooLarge as exc:
            self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, str(exc), codec.JSON)
            return
        if self._reader.timed_out:
            self._missed_deadline()

    def handle_expect_100(self) -> bool:
        """Defers "100 Continue" until the body is about to be read (`_invite_body`).

        The base class sends it from `parse_request`, before any check: a
        client with a wrong token, or a body too big or for no endpoint, was
        invited to upload it. Deferred, a refused request gets its error
        status and `Connection: close` instead, and its body is never
        invited (one sent anyway after a 503 is read and dropped:
        `_answer_unread`).
        """
        self._continue_due = True
        return True

    def _invite_body(self) -> None:
        """Sends the deferred "100 Continue", once: the request passed every check on its head."""
        if self._continue_due:
            self._continue_due = False
            super().handle_expect_100()

    def send_response(self, code: int, message: str | None = None) -> None:
        """Notes that an answer began, so a request that times out later gets no second one."""
        self._answered = True
        super().send_response(code, message)

    def do_GET(self) -> None:
        """Reads (`info`, `health`) come as GET, so proxies and `curl` can call them plainly."""
        self._handle("GET")

    def do_POST(self) -> None:
        """Every call with a body (episode calls, uploads, weight syncs) comes as POST."""
        self._handle("POST")

    def do_PUT(self) -> None:
        """Other methods get 405 naming the two the API takes, not the base class's 501."""
        self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, "use GET or POST", codec.JSON)

    do_DELETE = do_PATCH = do_PUT

    def _handle(self, method: str) -> None:
        server = self.server.policy_server
        content_type = self._content_type()
        if not server.begin_request():
            self._refuse_stopping(server, method, content_type)
            return
        try:
            self._handle_request(server, method, content_type)
        finally:
            server.end_request()

    def _handle_request(self, server: PolicyEndpoint, method: str, content_type: str) -> None:
        """Checks the token, path, content type and size, reserves memory, then answers."""
        if server.token is not None and not self._authorized(server.token):
            self._refuse(HTTPStatus.UNAUTHORIZED, "missing or wrong token: send "
                         "'Authorization: Bearer <token>'", content_type)
            return
        if not self.path.startswith(API_PREFIX):
            self._refuse_endpoint(HTTPStatus.NOT_FOUND, f"no endpoint {self.path!r}; the API "
                                  f"lives under {API_PREFIX}", content_type)
            return
        name = self.path[len(API_PREFIX):].split("?")[0]
        try:
            server.route(method, name)
        except HTTPStatusError as exc:
            self._refuse_endpoint(exc.status, str(exc), content_type)
            return
        if method == "POST":
            declared = self.headers.get("Content-Type", "").split(";")[0].strip()
            if declared not in codec.CONTENT_TYPES:
                self._refuse(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be one of "
                             f"{list(codec.CONTENT_TYPES)}; nothing else is decoded", codec.JSON)
                return
            length = self._body_length(server.max_body_bytes, content_type)
            if length is None:
                return
            factor = JSON_MEMORY_FACTOR if content_type == codec.JSON else BINARY_MEMORY_FACTOR
            reservation = server.body_budget.open(length * factor)
            try:
                self._answer(server, method, name, content_type, length, reservation)
            finally:
                reservation.close()
                if length >= TRIM_AFTER_BYTES:
                    release_free_memory()
        elif self._declares_body():
            self._refuse(HTTPStatus.BAD_REQUEST, "a GET takes no body: send it without "
                         "Content-Length (or with 0) and without Transfer-Encoding", content_type)
        else:
            self._answer(server, method, name, content_type, 0, None)

    def _answer(
        self, server: PolicyEndpoint, method: str, name: str, content_type: str, length: int,
        reservation: BodyReservation | None,
    ) -> None:
        """Reads a body of `length` bytes (if `reservation`) as the reservation grows, reserves
        its decoding cost, runs the call and sends its answer; errors become statuses."""
        body = raw = None
        if reservation is not None:
            raw = self._read_body(length, reservation, server)
            if raw is None:
                return
            if not self._reserve(reservation, reservation.claim, server):
                del raw  # freed before waiting for the client to read the 503
                self._refuse_no_room(server, content_type, 0)
                return
        try:
            if raw is not None:
                if content_type == codec.JSON:
                    raw = codec.json_text(raw)  # the bytes are freed before parsing
                body = codec.decode(raw, content_type)
                del raw
            result = server.call(method, name, body)
            del body
            payload = result if isinstance(result, bytes) else codec.encode(result, content_type)
            if isinstance(result, bytes):
                content_type = codec.BINARY
        except HTTPStatusError as exc:
            self._send(exc.status, {"error": str(exc), "type": "HTTPError"}, content_type)
            return
        except Exception as exc:
            status = next((s for t, s in STATUS_OF if isinstance(exc, t)), None)
            if status is None:
                logger.exception("request %s %s failed", method, self.path)
                status = HTTPStatus.INTERNAL_SERVER_ERROR
            self._send(status, {"error": str(exc), "type": type(exc).__name__}, content_type)
            return
        self._send_bytes(HTTPStatus.OK, payload, content_type)

    def _missed_deadline(self) -> None:
        """Ends a connection whose request came (or answer was read) too slowly: counted and
        logged once, 408 if nothing was answered yet (the client may be sending still: it may
        not read it)."""
        self.close_connection = True
        if self._missed:
            return
        self._missed = True
        count = self.server.count_timed_out()
        logger.info("closing the connection from %s: its request or answer missed its deadline "
                    "(%d so far)", self.client_address[0], count)
        if not self._answered:
            payload = codec.encode({"error": "the request did not arrive in time: send the "
                                    "request line and headers within "
                                    f"{self.server.request_timeout_s:g} s, and the body at "
                                    f"{self.server.min_body_rate:g} bytes/s or more",
                                    "type": "HTTPError"}, codec.JSON)
            self._send_bytes(HTTPStatus.REQUEST_TIMEOUT, payload, codec.JSON)

    def _refuse_stopping(self, server: PolicyEndpoint, method: str, content_type: str) -> None:
        """503 and `Connection: close` to a request that came after `close()` began.

        An authorized request's body of a sane declared size is read and
        dropped (`_answer_unread`), so that the client, maybe still sending
        it, gets to read the answer; anyone else gets no read of up to
        `max_body_bytes`.
        """
        self.close_connection = True
        payload = codec.encode({"error": STOPPING_MESSAGE, "type": "ExternalEnvStopped"},
                               content_type)
        length = self._declared_length()
        authorized = server.token is None or self._authorized(server.token)
        if method == "POST" and authorized and length is not None and length <= server.max_body_bytes:
            self._reader.expect_body()
            self._answer_unread(HTTPStatus.SERVICE_UNAVAILABLE, payload, content_type, length)
        else:
            self._send_bytes(HTTPStatus.SERVICE_UNAVAILABLE, payload, content_type)

    def _content_type(self) -> str:
        declared = self.headers.get("Content-Type", "").split(";")[0].strip()
        accept = self.headers.get("Accept", "")
        if declared in codec.CONTENT_TYPES:
            return declared
        return codec.JSON if codec.JSON in accept or codec.BINARY not in accept else codec.BINARY

    def _authorized(self, token: str) -> bool:
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {token}"
        return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))

    def _declares_body(self) -> bool:
        """Whether the request frames a body: any Transfer-Encoding, or a Content-Length not 0.

        A GET's body is never read: kept on the connection, it would be taken
        for the next request, one that a proxy in front never saw (smuggling).
        """
        lengths = self.headers.get_all("Content-Length", [])
        return "Transfer-Encoding" in self.headers or any(v.strip() != "0" for v in lengths)

    def _body_length(self, limit: int, content_type: str) -> int | None:
        """The declared body length, or None after refusing a chunked, missing or oversized one."""
        if "Transfer-Encoding" in self.headers:  # every Transfer-Encoding header, not the first
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "chunked (or any Transfer-Encoding) "
                         "bodies are not accepted; send Content-Length", content_type)
            return None
        length = self._declared_length()
        if length is None:
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "a POST needs a valid Content-Length",
                         content_type)
            return None
        if length > limit:
            self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"body of {length} bytes is over the server's limit of {limit} bytes",
                         content_type)
            return None
        return length

    def _declared_length(self) -> int | None:
        """Content-Length if it is ASCII digits only (RFC 9110) and said once, else None.

        `int()` also takes "+2", "1_0" and non-ASCII digits, and a second
        Content-Length header with another value may be the one a proxy in
        front reads: either way it would read another length than this
        server, and a body boundary attackers choose.
        """
        texts = set(self.headers.get_all("Content-Length", []))
        text = texts.pop() if len(texts) == 1 else ""
        return int(text) if text.isascii() and text.isdigit() else None

    def _read_body(
        self, length: int, reservation: BodyReservation, server: PolicyEndpoint
    ) -> bytearray | None:
        """`length` bytes read into one buffer, each `READ_STEP` only once `reservation` covers
        it; None if the client went away, missed its deadline, or no room came in time (503)."""
        self._reader.expect_body()
        raw = bytearray()
        try:
            while len(raw) < length:
                wanted = min(length - len(raw), READ_STEP)
                if not self._reserve(reservation, len(raw) + wanted, server):
                    left = length - len(raw)
                    del raw
                    reservation.close()  # nothing held while the rest is read and dropped
                    self._refuse_no_room(server, self._content_type(), left)
                    return None
                self._invite_body()
                chunk = self.rfile.read(wanted)
                raw += chunk
                if len(chunk) < wanted:
                    break
        except (TimeoutError, OSError):
            pass
        if len(raw) != length:
            self.close_connection = True  # the client went away mid-body
            return None
        return raw

    def _reserve(self, reservation: BodyReservation, nbytes: int, server: PolicyEndpoint) -> bool:
        """Grows `reservation` to `nbytes`, waiting at most `body_wait_s`; the wait is the
        server's, not the client's, so the body's deadline moves on by it."""
        began = time.monotonic()
        granted = reservation.grow_to(nbytes, server.body_wait_s)
        self._reader.excuse(time.monotonic() - began)
        return granted

    def _refuse_no_room(self, server: PolicyEndpoint, content_type: str, left: int) -> None:
        """503 with `Retry-After` to a body that found no room in the memory budget in time:
        logged once; the `left` bytes still unread are read and dropped (`_answer_unread`),
        so that the client, maybe still sending them, gets to read the answer."""
        budget = server.body_budget
        logger.info("refusing a body from %s: no room in the memory budget within %g s (%d so "
                    "far)", self.client_address[0], server.body_wait_s, budget.refused)
        payload = codec.encode({"error": f"the server is decoding {budget.in_flight} bytes' "
                                "worth of other bodies; retry in a moment", "type": "HTTPError"},
                               content_type)
        self._answer_unread(HTTPStatus.SERVICE_UNAVAILABLE, payload, content_type, left,
                            {"Retry-After": "1"})

    def _answer_unread(
        self, status: HTTPStatus, payload: bytes, content_type: str, left: int,
        headers: dict | None = None,
    ) -> None:
        """Answers a request whose last `left` body bytes are unread, so that no reset hides it.

        Closing a socket with unread bytes resets the connection: a client
        still sending fails on its send and never reads the answer. A body
        the client was invited to send (or sent without asking) is read and
        dropped first, then answered. A body never invited (`Expect:
        100-continue`, no "100 Continue") may never come: a client that
        waits gets the answer at once, with `Connection: close`; then the
        write side shuts and whatever the client sends anyway is read and
        dropped, up to `left` bytes, until its first quiet second
        (`DRAIN_QUIET_S`) or the body's deadline.
        """
        if self._continue_due:
            self.close_connection = True
            self._send_bytes(status, payload, content_type, headers)
            with contextlib.suppress(OSError):  # the client is gone already
                self.connection.shutdown(socket.SHUT_WR)
            self._reader.expect_drain()
            self._discard_body(left)
            return
        if left and not self._discard_body(left):
            return
        self._send_bytes(status, payload, content_type, headers)

    def _discard_body(self, length: int) -> bool:
        """Reads `length` body bytes into a small buffer, keeping none; False if the client left
        (or, draining, went quiet) first."""
        chunk = bytearray(min(length, 1 << 16)) or bytearray(1)
        left = length
        try:
            while left > 0:
                wanted = min(left, len(chunk))
                count = self.rfile.readinto(memoryview(chunk)[:wanted])
                left -= count
                if count < wanted:  # the end: the client closed (or, draining, went quiet)
                    break
        except (TimeoutError, OSError):
            pass
        if left:
            self.close_connection = True
        return not left

    def _refuse(
        self, status: HTTPStatus, message: str, content_type: str, headers: dict | None = None
    ) -> None:
        """An error answered before the body was read: the connection cannot be reused."""
        self.close_connection = True
        payload = codec.encode({"error": message, "type": "HTTPError"}, content_type)
        self._send_bytes(status, payload, content_type, headers)

    def _refuse_endpoint(self, status: HTTPStatus, message: str, content_type: str) -> None:
        """404 or 405 for a path or method no endpoint takes; with no body at stake (a GET, a
        POST of 0 bytes) the connection stays open for the next request, else `_refuse`."""
        if self._declares_body():
            self._refuse(status, message, content_type)
        else:
            self._send(status, {"error": message, "type": "HTTPError"}, content_type)

    def _send(self, status: HTTPStatus, value: dict, content_type: str) -> None:
        self._send_bytes(status, codec.encode(value, content_type), content_type)

    def _send_bytes(
        self, status: HTTPStatus, payload: bytes, content_type: str, headers: dict | None = None
    ) -> None:
        if self.server.saturated:
            self.close_connection = True  # other connections wait for a worker: take turns
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except TimeoutError:  # the client stopped reading its answer (`DeadlineWriter`)
            self._missed_deadline()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client is gone; nothing to tell it

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)
