"""The client side of the wire: libcurl (pycurl) handles kept alive for reuse, and the codec.

libcurl, not urllib3 or httpx: it takes a client about 40 % less CPU per
`get_action` call than urllib3 (httpx takes more), and the clients share
the cores with the server. Retried, with backoff: a call whose connection
could not be opened, a 503 (or 429) with `Retry-After` (the server did
nothing), and a `GET` after any connection error. A `POST` that may have
reached the server never is (none is idempotent): libcurl would send one
again when a reused connection closes unanswered, so bodies go through a
reader that refuses to rewind, and the call fails instead.
"""

from __future__ import annotations

import io
import select
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pycurl

from marl_runner.serving import codec

API_PREFIX = "/v1/"
DEFAULT_RETRIES = 4
DEFAULT_BACKOFF_S = 0.1
MAX_RETRY_AFTER_S = 5.0  # a server's Retry-After is honoured up to this, per attempt
MAX_BACKOFF_S = 120.0
POOL_SIZE = 256  # idle handles (each with its kept-alive connection) kept, at most

# Error types the server names that a client re-raises as the same built-in exception.
_BUILTIN_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError, "RequestError": ValueError, "CodecError": ValueError,
    "TimeoutError": TimeoutError, "NotImplementedError": NotImplementedError,
}
_NOT_SENT = frozenset({pycurl.E_COULDNT_CONNECT, pycurl.E_COULDNT_RESOLVE_HOST})
_PER_CALL_FUNCTIONS = (pycurl.READFUNCTION, pycurl.WRITEFUNCTION, pycurl.HEADERFUNCTION)
_RETRY_AFTER_STATUSES = frozenset({429, 503})


class PolicyServerError(RuntimeError):
    """The server refused or failed a request (e.g. 401, 413, 503 after it stopped)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"policy server answered {status} ({error_type}): {message}")
        self.status = status
        self.error_type = error_type


class PolicyServerUnavailable(ConnectionError):
    """The server could not be reached, or the connection failed during a call. `sent`:
    the request may have reached the server (a `POST` it may have acted on)."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


class HttpTransport:
    """Calls `/v1/<name>` on a policy server (`http://HOST:PORT` or `HOST:PORT`) from any
    number of threads. `timeout_s`: the most one attempt may take, connecting included
    (None: no limit). `retries`: more attempts for a call that may be retried (see the
    module docstring); the n-th waits `backoff_s * 2 ** (n - 1)` (the first goes at once),
    or the server's Retry-After, at most `MAX_RETRY_AFTER_S`."""

    def __init__(self, address: str, token: str | None = None, timeout_s: float | None = None,
                 content_type: str = codec.BINARY, retries: int = DEFAULT_RETRIES,
                 backoff_s: float = DEFAULT_BACKOFF_S) -> None:
        parts = urlsplit(address if "://" in address else f"http://{address}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"address {address!r}: expected 'http://HOST:PORT' or 'HOST:PORT'")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries {retries!r}: expected an int >= 0")
        if not backoff_s >= 0:
            raise ValueError(f"backoff_s {backoff_s!r}: expected a number >= 0")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s {timeout_s!r}: expected a number > 0, or None")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        self.url = f"http://{host}:{parts.port}"
        self.content_type, self.retries, self.backoff_s = content_type, retries, backoff_s
        timeout_ms = 0 if timeout_s is None else max(1, round(timeout_s * 1000))
        self._handle_options = (
            (pycurl.NOSIGNAL, 1),  # timeouts without SIGALRM: any thread may call
            (pycurl.PROXY, ""),  # never through a proxy the environment names
            (pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1),
            (pycurl.TIMEOUT_MS, timeout_ms), (pycurl.CONNECTTIMEOUT_MS, timeout_ms),
            (pycurl.SEEKFUNCTION, _never_rewind),  # a body that went out never goes again
            (pycurl.NOPROGRESS, 0), (pycurl.XFERINFOFUNCTION, _let_signals_in),
        )
        # No default Accept. libcurl's `Expect: 100-continue` above 1 MiB stays: a big body
        # refused is answered before it is sent, not reset mid-send with its answer lost.
        auth = [f"Authorization: Bearer {token}"] if token else []
        self._headers = {"POST": [f"Content-Type: {content_type}", "Accept:", *auth],
                         "GET": [f"Accept: {content_type}", *auth]}
        self._idle: list[pycurl.Curl] = []
        self._lock = threading.Lock()
        self._generation = 0  # bumped by `close`: older handles are closed, not kept

    def post(self, name: str, value: Any) -> Any:
        """`POST /v1/<name>` with `value` encoded; returns the decoded answer."""
        return self._call("POST", name, codec.encode(value, self.content_type))

    def get(self, name: str) -> Any:
        """`GET /v1/<name>`; returns the decoded answer."""
        return self._call("GET", name, None)

    def close(self) -> None:
        """Closes the kept-alive connections (those in use once their call ends); a later
        call opens fresh ones."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for handle in idle:
            handle.close()

    def _call(self, method: str, name: str, body: bytes | None) -> Any:
        """One call, with the retries the module docstring lists."""
        attempt = 1
        while True:
            try:
                status, content_type, payload, retry_after = self._attempt(method, name, body)
            except PolicyServerUnavailable as exc:
                if exc.sent or attempt > self.retries:
                    raise
                wait = 0.0 if attempt == 1 else min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
            else:
                if retry_after is None or attempt > self.retries:
                    return _answer(status, content_type, payload)
                wait = min(max(retry_after, 0.0), MAX_RETRY_AFTER_S)
            time.sleep(wait)
            attempt += 1

    def _attempt(self, method: str, name: str,
                 body: bytes | None) -> tuple[int, str, bytes, float | None]:
        """One request: (status, content type, body, Retry-After seconds of a 429/503 that
        has it, else None); a failed connection raises `PolicyServerUnavailable`."""
        handle, generation = self._take()
        answer, head = io.BytesIO(), []
        handle.setopt(pycurl.URL, self.url + API_PREFIX + name)
        if body is None:
            handle.setopt(pycurl.HTTPGET, 1)
        else:
            handle.setopt(pycurl.POST, 1)
            handle.setopt(pycurl.READFUNCTION, io.BytesIO(body).read)
            handle.setopt(pycurl.POSTFIELDSIZE_LARGE, len(body))
        handle.setopt(pycurl.HTTPHEADER, self._headers[method])
        handle.setopt(pycurl.WRITEFUNCTION, answer.write)
        handle.setopt(pycurl.HEADERFUNCTION, head.append)
        try:
            handle.perform()
        except pycurl.error as exc:
            code, message = exc.args
            sent = method == "POST" and code not in _NOT_SENT and (
                handle.getinfo(pycurl.REQUEST_SIZE) > 0 or code == pycurl.E_SEND_FAIL_REWIND)
            handle.close()  # its connection's state is unknown: never reused
            raise self._unavailable(method, name, code, message, sent) from None
        except BaseException:  # Ctrl-C (see `_let_signals_in`): the same
            handle.close()
            raise
        for function in _PER_CALL_FUNCTIONS:  # an idle handle holds nothing of its last call
            handle.unsetopt(function)
        status = handle.getinfo(pycurl.RESPONSE_CODE)
        content_type = handle.getinfo(pycurl.CONTENT_TYPE) or codec.JSON
        retry_after = None
        if status in _RETRY_AFTER_STATUSES and any(line[:12].lower() == b"retry-after:" for line in head):
            retry_after = float(handle.getinfo(pycurl.RETRY_AFTER))
        with self._lock:
            kept = generation == self._generation and len(self._idle) < POOL_SIZE
            if kept:
                self._idle.append(handle)
        if not kept:
            handle.close()
        return status, content_type, answer.getvalue(), retry_after

    def _take(self) -> tuple[pycurl.Curl, int]:
        """An idle handle whose connection the server has not closed, else a new one."""
        with self._lock:
            handle = self._idle.pop() if self._idle else None
            generation = self._generation
        if handle is not None:
            if not _dropped(handle):
                return handle, generation
            handle.close()
        handle = pycurl.Curl()
        for option, value in self._handle_options:
            handle.setopt(option, value)
        return handle, generation

    def _unavailable(self, method: str, name: str, code: int, message: str,
                     sent: bool) -> PolicyServerUnavailable:
        kind = "TimeoutError" if code == pycurl.E_OPERATION_TIMEDOUT else "ConnectionError"
        call, what = f"policy server {self.url}: {method} {API_PREFIX}{name}", f"{kind}: {message}"
        if sent:
            return PolicyServerUnavailable(f"{call} failed after the request was sent ({what}); "
                                           "not retried, since the server may have acted on it",
                                           sent=True)
        tries = f"{self.retries + 1} attempt{'s' if self.retries else ''}"
        return PolicyServerUnavailable(
            f"{call} failed after {tries} ({what}); is the server running at that address?")


def _dropped(handle: pycurl.Curl) -> bool:
    """Whether the server closed (or wrote unasked on) the handle's kept-alive connection:
    libcurl would send on it, then send again on a fresh one."""
    fd = handle.getinfo(pycurl.ACTIVESOCKET)
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _let_signals_in(*progress: int) -> int:
    """Run by libcurl at least once a second while a call waits: a Ctrl-C raises here."""
    return 0


def _never_rewind(offset: int, origin: int) -> int:
    return pycurl.SEEKFUNC_FAIL


def _answer(status: int, content_type: str, payload: bytes) -> Any:
    """The decoded answer of a 200; the server's error raised as what it names otherwise."""
    try:
        value = codec.decode(payload, content_type.split(";")[0].strip())
    except codec.CodecError:
        value = {"error": payload[:200].decode("utf-8", "replace"), "type": "HTTPError"}
    if status == 200:
        return value
    error = value if isinstance(value, dict) else {}
    message, error_type = str(error.get("error", "no message")), str(error.get("type", "HTTPError"))
    builtin = _BUILTIN_ERRORS.get(error_type)
    if builtin is not None:
        raise builtin(message)
    raise PolicyServerError(status, error_type, message)
