"""The client side of the wire: urllib3's keep-alive pool and `Retry`, and the safe codec.

urllib3, not httpx or pycurl: a small request costs a client here about 230 µs
of CPU with urllib3, 450 µs with httpx. pycurl halves a client's CPU per call,
but libcurl sends a request again, unasked, when a reused connection closes
before any answer, and a call here must never act twice. Retried, with
backoff: a call whose connection could not be opened, a 503 with
`Retry-After` (the server did nothing), and a `GET` after any connection
error. A `POST` that may have reached the server never is (none of them is
idempotent).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import HTTPError, MaxRetryError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util import SKIP_HEADER

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
# Connections kept open for reuse (one per thread calling at once, up to this many).
POOL_SIZE = 256


class PolicyServerError(RuntimeError):
    """The server refused or failed a request (e.g. 401, 413, 503 after it stopped)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"policy server answered {status} ({error_type}): {message}")
        self.status = status
        self.error_type = error_type


class PolicyServerUnavailable(ConnectionError):
    """The server could not be reached, or the connection failed during a call.

    `sent`: the request may have reached the server (a `POST` it may have acted on).
    """

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


class _OneWriteConnection(HTTPConnection):
    """urllib3's connection, sending a request's head and body in one write (urllib3 writes
    them apart: each write costs the client about 150 µs of CPU here, the server a wakeup)."""

    _holding: bytearray | None = None
    _head = b""

    def endheaders(self, message_body: Any = None, *, encode_chunked: bool = False) -> None:
        self._holding = bytearray()
        try:
            super().endheaders(message_body, encode_chunked=encode_chunked)
        finally:
            self._head, self._holding = bytes(self._holding), None

    def send(self, data: Any) -> None:
        if self._holding is not None:
            self._holding += data
            return
        head, self._head = self._head, b""
        super().send(head + data if head else data)

    def getresponse(self) -> Any:
        if self._head:
            head, self._head = self._head, b""
            super().send(head)
        return super().getresponse()

    def close(self) -> None:
        self._head = b""  # a failed request's head never goes out on the next connection
        super().close()


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _OneWriteConnection


class HttpTransport:
    """Calls `/v1/<name>` on a policy server (`http://HOST:PORT` or `HOST:PORT`) from any
    number of threads. `timeout_s`: of each connect, send and read (None: no limit).
    `retries`: more attempts for a call that may be retried (see the module docstring);
    the n-th waits `backoff_s * 2 ** (n - 1)` (the first goes at once), or the server's
    Retry-After, at most `MAX_RETRY_AFTER_S`."""

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
        self.url = f"http://{parts.hostname}:{parts.port}"
        self.content_type = content_type
        self.retries = retries
        self.backoff_s = backoff_s
        # A POST is never sent twice (read=False: an error once it may have been sent raises);
        # urllib3 retries it when no connection opened, or on a 503 with Retry-After.
        policy = {"total": retries, "backoff_factor": backoff_s, "allowed_methods": None,
                  "raise_on_status": False, "retry_after_max": MAX_RETRY_AFTER_S}
        self._retries = {"GET": urllib3.Retry(**policy), "POST": urllib3.Retry(**policy, read=False)}
        # A POST's answer comes in its body's codec; a GET asks for one with Accept. No
        # User-Agent or Accept-Encoding (urllib3 and http.client would add them): the server
        # reads neither, and each header costs both sides parsing.
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        auth.update({"User-Agent": SKIP_HEADER, "Accept-Encoding": SKIP_HEADER})
        self._headers = {"POST": {"Content-Type": content_type, **auth},
                         "GET": {"Accept": content_type, **auth}}
        self._pool_args = (parts.hostname, parts.port, urllib3.Timeout(timeout_s, timeout_s))
        self._pool = self._new_pool()

    def post(self, name: str, value: Any) -> Any:
        """`POST /v1/<name>` with `value` encoded; returns the decoded answer."""
        return self._call("POST", name, codec.encode(value, self.content_type))

    def get(self, name: str) -> Any:
        """`GET /v1/<name>`; returns the decoded answer."""
        return self._call("GET", name, None)

    def close(self) -> None:
        """Closes the pooled connections; a later call opens fresh ones."""
        pool, self._pool = self._pool, self._new_pool()
        pool.close()

    def _new_pool(self) -> urllib3.HTTPConnectionPool:
        host, port, timeout = self._pool_args
        return _Pool(host, port, maxsize=POOL_SIZE, retries=False, timeout=timeout)

    def _call(self, method: str, name: str, body: bytes | None) -> Any:
        """One call, with the retries the module docstring lists."""
        try:
            response = self._pool.urlopen(
                method, API_PREFIX + name, body=body, headers=self._headers[method],
                retries=self._retries[method], redirect=False, preload_content=True,
            )
        except MaxRetryError as exc:  # never sent, or a GET: retried up to the last attempt
            raise self._unavailable(method, name, exc.reason, sent=False) from exc
        except HTTPError as exc:  # a POST that may have been sent (urllib3 retries a GET)
            raise self._unavailable(method, name, exc, sent=method != "GET") from exc
        return _answer(response)

    def _unavailable(
        self, method: str, name: str, cause: Exception | None, sent: bool
    ) -> PolicyServerUnavailable:
        kind = "TimeoutError" if isinstance(cause, Urllib3Timeout) else type(cause).__name__
        what = f"{kind}: {cause}" if str(cause) else kind
        call = f"policy server {self.url}: {method} {API_PREFIX}{name}"
        if sent:
            return PolicyServerUnavailable(
                f"{call} failed after the request was sent ({what}); not retried, since the "
                "server may have acted on it", sent=True,
            )
        attempts = self.retries + 1
        tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
        return PolicyServerUnavailable(
            f"{call} failed after {tries} ({what}); is the server running at that address?"
        )


def _answer(response: urllib3.BaseHTTPResponse) -> Any:
    """The decoded answer of a 200; the server's error raised as what it names otherwise."""
    response_type = (response.headers.get("Content-Type") or codec.JSON).split(";")[0].strip()
    payload = response.data
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
    raise PolicyServerError(response.status, error_type, message)
