"""The HTTP side of `PolicyServer` on aiohttp's server: one request, one API call, one answer.

aiohttp does the connections, parsing, keep-alive, backlog and graceful
shutdown. Added here: what must be refused before a body is read (closing,
concurrency, token, endpoint, content type, framing, size; docs/SERVING.md
lists the statuses), the deadlines that cut off a client dripping its
request, and exceptions mapped to statuses with `{"error", "type"}` bodies
that the client re-raises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Self

from aiohttp import web

from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.serving import codec

logger = logging.getLogger(__name__)

API_PREFIX = "/v1/"
STOPPING_MESSAGE = "the server is stopping; this request was not run"
# Bodies bigger than this are decoded off the event loop, so other clients go on.
DECODE_IN_THREAD_BYTES = 64 * 1024
# How long a refused request's body is read and dropped, so its client reads the answer.
LINGER_S = 2.0
# Room for an answer's status line and headers when judging whether it fits the write buffer.
ANSWER_HEAD_BYTES = 1024
BODY_TOO_SHORT = "the body ended before its Content-Length"
# A request line or header line longer than this gets 400.
MAX_LINE_BYTES = 16 * 1024
_NO_DEADLINE = contextlib.nullcontext()

# Exception types a client re-raises as themselves (anything else: PolicyServerError).
STATUS_OF: tuple[tuple[type[BaseException], HTTPStatus], ...] = (
    (ExternalEnvStopped, HTTPStatus.SERVICE_UNAVAILABLE),
    (TimeoutError, HTTPStatus.SERVICE_UNAVAILABLE),
    (NotImplementedError, HTTPStatus.NOT_IMPLEMENTED),
    (MemoryError, HTTPStatus.SERVICE_UNAVAILABLE),
    (ValueError, HTTPStatus.BAD_REQUEST),  # RequestError, CodecError, unknown episodes
)


class HTTPStatusError(Exception):
    """A request refused with a given status (unknown endpoint, wrong method, too big...)."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HttpSettings:
    """What `marl-runner serve`'s flags set on the server.

    `max_concurrency`: requests handled at once (one more gets 503 with
    `Retry-After`). `idle_timeout_s`: a connection with no complete request
    for this long is closed (it bounds a request's head too).
    `request_timeout_s` + length / `min_body_rate`: the deadline of a body,
    and of its answer being taken. `close_wait_s`: how long closing waits.
    """

    max_body_bytes: int
    max_concurrency: int
    backlog: int = 256
    idle_timeout_s: float = 5.0
    request_timeout_s: float = 10.0
    min_body_rate: float = 64 * 1024
    close_wait_s: float = 10.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            counts = name in ("max_body_bytes", "max_concurrency", "backlog")
            kinds = int if counts else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < float("inf"):
                raise ValueError(f"{name} {value!r}: expected "
                                 f"{'an int >= 1' if counts else 'a finite number > 0'}")

    def body_deadline_s(self, length: int) -> float:
        """Seconds a body of `length` bytes (or an answer) may take: a head start, then a rate."""
        return self.request_timeout_s + length / self.min_body_rate


Route = Callable[[Any], Awaitable[Any]]


class HttpEndpoint:
    """Serves `routes` on a listening socket from an event loop in a background thread.

    `routes[(method, name)]` is a coroutine function taking the decoded body
    (None for a GET) and returning the answer's value (`bytes` when already
    encoded). `start()` serves `sock` (bound already).
    """

    def __init__(self, routes: dict[tuple[str, str], Route], settings: HttpSettings,
                 token: str | None, sock: socket.socket) -> None:
        self.routes = routes
        self.settings = settings
        self.token = token
        self.sock = sock
        # Whether closing has begun: every request from then on is answered 503.
        self.closing = False
        self._close_began = False
        # Requests, or answers left unread, that missed their deadline (408 where possible).
        self.requests_timed_out = 0
        self.loop = asyncio.new_event_loop()
        # Blocking calls (a slot to free, the runner's weights) wait here, not on the loop.
        self.loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            settings.max_concurrency, thread_name_prefix="marl-runner-call"))
        self._in_progress = 0
        self._idle: asyncio.Event | None = None
        self._web_runner: web.ServerRunner | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Starts the event loop thread and begins accepting connections; returns `self`."""

        def run() -> None:
            # Closing the Runner cancels and awaits the tasks left, then the executor: aiohttp
            # forgets a handler whose client left, so cleanup() alone would not end it.
            with asyncio.Runner(loop_factory=lambda: self.loop):
                self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="marl-runner-http", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._setup(), self.loop).result()
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self._thread = None  # nothing runs: stop_serving() has no loop to ask
            raise
        return self

    async def _setup(self) -> None:
        server = web.Server(
            self._handle, keepalive_timeout=self.settings.idle_timeout_s,
            lingering_time=LINGER_S, max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES, access_log=None,
        )
        self._idle = asyncio.Event()
        self._idle.set()
        self._web_runner = web.ServerRunner(server, shutdown_timeout=self.settings.close_wait_s)
        await self._web_runner.setup()
        await web.SockSite(self._web_runner, self.sock, backlog=self.settings.backlog).start()

    def stop_serving(self, on_closed: Callable[[], None], wait_s: float | None = None) -> None:
        """Stops accepting (new requests: 503), waits up to `wait_s` (default `close_wait_s`)
        for the requests in progress, calls `on_closed` and closes idle connections. Requests
        still running finish in the background (aiohttp's graceful shutdown, `close_wait_s`
        more), with their own answer (503 for an upload `on_closed` refused)."""
        if self._close_began:
            return  # closed already: a second call has nothing left to do
        self.closing = self._close_began = True
        wait_s = self.settings.close_wait_s if wait_s is None else wait_s
        if self._thread is None:
            on_closed()
            self.sock.close()
            return

        async def shutdown() -> None:
            assert self._web_runner is not None and self._idle is not None
            for site in list(self._web_runner.sites):
                await site.stop()
            try:
                await asyncio.wait_for(self._idle.wait(), wait_s)
            except TimeoutError:
                logger.warning("closing with %d request(s) still in progress after %.1f s; "
                               "uploads among them are refused (503)", self._in_progress, wait_s)
            on_closed()
            self.loop.create_task(self._finish())

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result()

    async def _finish(self) -> None:
        """Ends every connection once the requests still running are answered, then the loop."""
        assert self._web_runner is not None
        try:
            await self._web_runner.cleanup()
        finally:
            self.loop.stop()

    # ------------------------------------------------------------------ one request

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        content_type = _content_type(request)
        if self.closing:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, STOPPING_MESSAGE, content_type,
                          "ExternalEnvStopped", close=True)
        if self._in_progress >= self.settings.max_concurrency:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"the server is handling "
                          f"{self._in_progress} requests; retry in a moment", content_type,
                          headers={"Retry-After": "1"}, close=request.body_exists)
        self._in_progress += 1
        assert self._idle is not None
        self._idle.clear()
        try:
            return await self._answer(request, content_type)
        except HTTPStatusError as exc:
            # A refused head's body was never read: the connection cannot carry another request.
            return _error(exc.status, str(exc), content_type, close=request.body_exists)
        finally:
            self._in_progress -= 1
            if not self._in_progress:
                self._idle.set()

    async def _answer(self, request: web.BaseRequest, content_type: str) -> web.StreamResponse:
        """Checks the head, reads the body under its deadline, runs the call, answers."""
        route = self._route(request)
        length = self._body_length(request)
        raw = None if length is None else await self._read_body(request, length)
        try:
            body = None if raw is None else await _decode(raw, content_type)
            del raw
            result = await route(body)
            payload = result if isinstance(result, bytes) else codec.encode(result, content_type)
            answer_type = codec.BINARY if isinstance(result, bytes) else content_type
        except HTTPStatusError:
            raise
        except Exception as exc:
            status = next((s for t, s in STATUS_OF if isinstance(exc, t)), None)
            if status is None:
                logger.exception("request %s %s failed", request.method, request.path)
                status = HTTPStatus.INTERNAL_SERVER_ERROR
            return _error(status, str(exc), content_type, type(exc).__name__)
        return await self._send(request, payload, answer_type)

    def _route(self, request: web.BaseRequest) -> Route:
        """The call the head names, once the token and endpoint are right, else the refusal."""
        if self.token is not None and not _authorized(request, self.token):
            raise HTTPStatusError(HTTPStatus.UNAUTHORIZED,
                                  "missing or wrong token: send 'Authorization: Bearer <token>'")
        method, path = request.method, request.path
        if not path.startswith(API_PREFIX):
            raise HTTPStatusError(HTTPStatus.NOT_FOUND,
                                  f"no endpoint {path!r}; the API lives under {API_PREFIX}")
        name = path[len(API_PREFIX):]
        route = self.routes.get((method, name))
        if route is not None:
            return route
        if method not in ("GET", "POST"):
            raise HTTPStatusError(HTTPStatus.METHOD_NOT_ALLOWED, "use GET or POST")
        names = sorted(n for _, n in self.routes)
        if name in names:
            raise HTTPStatusError(HTTPStatus.METHOD_NOT_ALLOWED,
                                  f"{API_PREFIX}{name} does not take {method}")
        raise HTTPStatusError(HTTPStatus.NOT_FOUND, f"no endpoint {API_PREFIX}{name}; "
                              f"endpoints: {names}")

    def _body_length(self, request: web.BaseRequest) -> int | None:
        """A POST's declared length (None for a GET), refusing what cannot be read safely
        (aiohttp's parser already refuses a `Content-Length` not in digits, or given twice)."""
        headers = request.headers
        if request.method == "GET":
            if request.body_exists:
                raise HTTPStatusError(HTTPStatus.BAD_REQUEST, "a GET takes no body: send it "
                                      "without Content-Length (or with 0) and without "
                                      "Transfer-Encoding")
            return None
        declared = headers.get("Content-Type", "").split(";")[0].strip()
        if declared not in codec.CONTENT_TYPES:
            raise HTTPStatusError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be one "
                                  f"of {list(codec.CONTENT_TYPES)}; nothing else is decoded")
        if "Transfer-Encoding" in headers:
            raise HTTPStatusError(HTTPStatus.LENGTH_REQUIRED, "chunked (or any "
                                  "Transfer-Encoding) bodies are not accepted; send "
                                  "Content-Length")
        length = request.content_length
        if length is None:
            raise HTTPStatusError(HTTPStatus.LENGTH_REQUIRED, "a POST needs a valid Content-Length")
        if length > self.settings.max_body_bytes:
            raise HTTPStatusError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes "
                                  f"is over the server's limit of "
                                  f"{self.settings.max_body_bytes} bytes")
        return length

    async def _read_body(self, request: web.BaseRequest, length: int) -> bytes:
        """The body, read whole within its deadline (else 408 and the connection ends); no
        byte past the declared length is read, so nothing above `max_body_bytes` is held."""
        content = request.content
        # A body that arrived whole with its head has nothing to wait for: no timer.
        waits = not content.is_eof()
        if waits and request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            async with _deadline(self.settings.body_deadline_s(length) if waits else None):
                raw = await content.readexactly(length)
        except TimeoutError:
            self._missed_deadline(request)
            raise HTTPStatusError(HTTPStatus.REQUEST_TIMEOUT, "the request did not arrive in "
                                  f"time: send the body within {self.settings.request_timeout_s:g}"
                                  f" s plus {self.settings.min_body_rate:g} bytes/s") from None
        except asyncio.IncompleteReadError:
            raise HTTPStatusError(HTTPStatus.BAD_REQUEST, BODY_TOO_SHORT) from None
        return raw

    async def _send(self, request: web.BaseRequest, payload: bytes,
                    content_type: str) -> web.StreamResponse:
        """The answer, head and body in one send; under its deadline when it may have to wait
        for the client to read, so a client that stops reading cannot hold the connection."""
        response = web.Response(body=payload, status=200, content_type=content_type)
        transport = request.transport
        # One that fits the buffer below its high-water mark cannot wait: no timer.
        fits = transport is not None and (
            transport.get_write_buffer_size() + len(payload) + ANSWER_HEAD_BYTES
            <= transport.get_write_buffer_limits()[1]
        )
        try:
            async with _deadline(None if fits else self.settings.body_deadline_s(len(payload))):
                await response.prepare(request)
                await response.write_eof()  # waits while the client leaves answers unread
        except TimeoutError:
            self._missed_deadline(request)
            request.transport.abort()
        return response

    def _missed_deadline(self, request: web.BaseRequest) -> None:
        self.requests_timed_out += 1
        peer = request.remote
        logger.info("closing the connection from %s: its request or answer missed its deadline "
                    "(%d so far)", peer, self.requests_timed_out)


def _deadline(seconds: float | None) -> Any:
    """`asyncio.timeout(seconds)`; with no deadline, nothing (a timer costs a request µs)."""
    return _NO_DEADLINE if seconds is None else asyncio.timeout(seconds)


async def _decode(raw: bytes, content_type: str) -> Any:
    """The body's value; a big one is decoded in a thread, so other clients go on meanwhile."""
    if content_type == codec.JSON:
        raw = codec.json_text(raw)
    if len(raw) > DECODE_IN_THREAD_BYTES:
        return await asyncio.to_thread(codec.decode, raw, content_type)
    return codec.decode(raw, content_type)


def _content_type(request: web.BaseRequest) -> str:
    """The codec of the answer: the request's own, else what `Accept` asks for, else JSON."""
    declared = request.headers.get("Content-Type", "").split(";")[0].strip()
    if declared in codec.CONTENT_TYPES:
        return declared
    accept = request.headers.get("Accept", "")
    return codec.JSON if codec.JSON in accept or codec.BINARY not in accept else codec.BINARY


def _authorized(request: web.BaseRequest, token: str) -> bool:
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {token}".encode())


def _error(status: HTTPStatus, message: str, content_type: str, error_type: str = "HTTPError",
           *, headers: dict | None = None, close: bool = False) -> web.Response:
    """`{"error", "type"}` with `status`; `close`: the connection ends after it (a body the
    request framed was never read, so the connection cannot carry another request)."""
    response = web.Response(
        body=codec.encode({"error": message, "type": error_type}, content_type),
        status=int(status), content_type=content_type, headers=headers,
    )
    if close:
        response.force_close()
    return response
