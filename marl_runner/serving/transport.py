"""The client side of the wire: one keep-alive HTTP connection per thread, safe codec.

A connection that failed in any way is closed and replaced by a fresh one on
the next call, so one refused connection or timeout never poisons the calls
after it. Retries are bounded, with exponential backoff, and happen only
where a second attempt cannot do anything twice:

- any call whose connection could not be opened (nothing was sent);
- any call the server refused with 503 and a `Retry-After` header (it did
  nothing and asked to be asked again);
- a request on a kept-alive connection that the server had already closed
  (it never read it): once, at once, on a fresh connection, even with
  `retries=0` (a closed idle connection is routine, not a failure);
- `GET` calls (`info`, `health`: they change nothing) after any connection error.

A request whose send fails on a reset is first answered by what the server
sent before it closed, if anything: a server refusing a request before its
body (503 with `Retry-After` over the connection cap, 413, 401) answers and
closes, and that answer counts as for any request.

A `POST` that may have reached the server (a timeout or a dropped connection
after sending) is not retried: `get_action`, `log_returns`, uploads and
weight syncs are not idempotent. The caller gets `PolicyServerUnavailable`
naming the server, the call and the cause.
"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from marl_runner.serving import codec

API_PREFIX = "/v1/"
DEFAULT_RETRIES = 4
DEFAULT_BACKOFF_S = 0.1
# A server's Retry-After is honoured up to this many seconds per attempt.
MAX_RETRY_AFTER_S = 5.0

# Error types the server names that a client re-raises as the same built-in exception.
_BUILTIN_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "RequestError": ValueError,
    "CodecError": ValueError,
    "TimeoutError": TimeoutError,
    "NotImplementedError": NotImplementedError,
}
# The server closed a kept-alive connection before answering.
_STALE_CONNECTION_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class PolicyServerError(RuntimeError):
    """The server refused or failed a request (e.g. 401, 413, 503 after it stopped)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"policy server answered {status} ({error_type}): {message}")
        self.status = status
        self.error_type = error_type


class PolicyServerUnavailable(ConnectionError):
    """The server could not be reached, or the connection failed during a call."""


class _Refused(Exception):
    """A 503 with Retry-After: the server did nothing and asks to be asked again."""

    def __init__(self, error: PolicyServerError, retry_after_s: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


class HttpTransport:
    """Calls `/v1/<name>` on a policy server from any number of threads.

    Args:
        address: `http://HOST:PORT` or `HOST:PORT`.
        token: sent as `Authorization: Bearer <token>` when given.
        timeout_s: socket timeout per request; None waits as long as it takes.
        content_type: the codec of request bodies (binary by default).
        retries: how many times a call that may be retried (see the module
            docstring) is attempted again before it raises.
        backoff_s: the wait before the first retry; it doubles on each one.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout_s: float | None = None,
        content_type: str = codec.BINARY,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
    ) -> None:
        parts = urlsplit(address if "://" in address else f"http://{address}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"address {address!r}: expected 'http://HOST:PORT' or 'HOST:PORT'")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries {retries!r}: expected an int >= 0")
        if not backoff_s >= 0:
            raise ValueError(f"backoff_s {backoff_s!r}: expected a number >= 0")
        self.host, self.port = parts.hostname, parts.port
        self.url = f"http://{self.host}:{self.port}"
        self.timeout_s = timeout_s
        self.content_type = content_type
        self.retries = retries
        self.backoff_s = backoff_s
        self._headers = {"Content-Type": content_type, "Accept": content_type}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()
        self._connections: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()

    def post(self, name: str, value: Any) -> Any:
        """`POST /v1/<name>` with `value` encoded; returns the decoded answer."""
        return self._call("POST", name, codec.encode(value, self.content_type))

    def get(self, name: str) -> Any:
        """`GET /v1/<name>`; returns the decoded answer."""
        return self._call("GET", name, None)

    def close(self) -> None:
        """Closes every thread's connection; a later call opens a fresh one."""
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()

    def _call(self, method: str, name: str, body: bytes | None) -> Any:
        """One call with the retries the module docstring lists."""
        attempts = 1 + self.retries
        delay = self.backoff_s
        attempt = 1
        stale_retry_left = True  # outside the budget: the server never read that request
        while True:
            try:
                return self._request(method, name, body)
            except _Refused as refused:
                if attempt == attempts:
                    raise refused.error from None
                time.sleep(min(max(refused.retry_after_s, delay), MAX_RETRY_AFTER_S))
            except _Failed as failure:
                if failure.stale and stale_retry_left:
                    stale_retry_left = False
                    continue  # at once, on a fresh connection
                retry = not failure.sent or method == "GET"
                if not retry or attempt == attempts:
                    error = self._unavailable(method, name, failure, attempt if retry else 1)
                    raise error from failure.cause
                time.sleep(delay)
            attempt += 1
            delay *= 2

    def _unavailable(
        self, method: str, name: str, failure: _Failed, attempts: int
    ) -> PolicyServerUnavailable:
        cause = failure.cause
        what = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        call = f"policy server {self.url}: {method} {API_PREFIX}{name}"
        if failure.sent and method != "GET":
            return PolicyServerUnavailable(
                f"{call} failed after the request was sent ({what}); not retried, since the "
                "server may have acted on it"
            )
        tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
        return PolicyServerUnavailable(
            f"{call} failed after {tries} ({what}); is the server running at that address?"
        )

    def _request(self, method: str, name: str, body: bytes | None) -> Any:
        """One attempt; any failure leaves this thread without a connection."""
        try:
            response, payload = self._exchange(method, name, body)
        except _Failed:
            self._drop_connection()
            raise
        except (OSError, http.client.HTTPException) as exc:  # timeouts included
            self._drop_connection()
            raise _Failed(exc, sent=True) from exc
        except BaseException:
            self._drop_connection()
            raise
        if response.getheader("Connection", "").lower() == "close":
            self._drop_connection()
        return self._answer(response, payload)

    def _exchange(
        self, method: str, name: str, body: bytes | None
    ) -> tuple[http.client.HTTPResponse, bytes]:
        connection, reused = self._connection()
        try:
            if connection.sock is None:
                connection.connect()
        except OSError as exc:  # refused, unreachable, connect timeout: nothing was sent
            raise _Failed(exc, sent=False) from exc
        try:
            try:
                connection.request(method, API_PREFIX + name, body=body, headers=self._headers)
            except _STALE_CONNECTION_ERRORS:
                answered = _answer_before_reset(connection)
                if answered is None:
                    raise
                return answered
            response = connection.getresponse()
            return response, response.read()
        except _STALE_CONNECTION_ERRORS as exc:
            # On a reused connection: the server had closed it while idle and never read this.
            raise _Failed(exc, sent=not reused, stale=reused) from exc

    def _answer(self, response: http.client.HTTPResponse, payload: bytes) -> Any:
        response_type = (response.getheader("Content-Type") or codec.JSON).split(";")[0].strip()
        try:
            value = codec.decode(payload, response_type)
        except codec.CodecError:
            value = {"error": payload[:200].decode("utf-8", "replace"), "type": "HTTPError"}
        if response.status == 200:
            return value
        error = value if isinstance(value, dict) else {}
        message = str(error.get("error", "no message"))
        error_type = str(error.get("type", "HTTPError"))
        builtin = _BUILTIN_ERRORS.get(error_type)
        if builtin is not None:
            raise builtin(message)
        refusal = PolicyServerError(response.status, error_type, message)
        retry_after = _seconds(response.getheader("Retry-After"))
        if response.status == 503 and retry_after is not None:
            raise _Refused(refusal, retry_after)
        raise refusal

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            with self._lock:
                if connection in self._connections:  # else close() closed it meanwhile
                    return connection, True
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        self._local.connection = connection
        with self._lock:
            self._connections.add(connection)
        return connection, False

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
            with self._lock:
                self._connections.discard(connection)


class _Failed(Exception):
    """The connection failed; `sent`: the server may have received the request."""


    def __init__(self, cause: BaseException, *, sent: bool, stale: bool = False) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.sent = sent
        self.stale = stale  # a kept-alive connection the server had closed: retry at once


def _answer_before_reset(
    connection: http.client.HTTPConnection,
) -> tuple[http.client.HTTPResponse, bytes] | None:
    """The answer a server sent before it closed a request it did not read whole, or None.

    A server refusing a request before its body (503 with `Retry-After`
    over the connection cap, 413, 401) answers and closes; a reset then
    fails the send of a big body, but the answer came first and can be read.
    """
    try:
        response = connection.getresponse()
        return response, response.read()
    except (OSError, http.client.HTTPException):
        return None


def _seconds(header: str | None) -> float | None:
    """A Retry-After header in seconds (the HTTP-date form is not used by this server)."""
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
