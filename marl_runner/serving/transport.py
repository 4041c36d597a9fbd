"""The client side of the wire: one keep-alive HTTP connection per thread, safe codec."""

from __future__ import annotations

import http.client
import threading
from typing import Any
from urllib.parse import urlsplit

from marl_runner.serving import codec

API_PREFIX = "/v1/"

# Error types the server names that a client re-raises as the same built-in exception.
_BUILTIN_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "RequestError": ValueError,
    "CodecError": ValueError,
    "TimeoutError": TimeoutError,
    "NotImplementedError": NotImplementedError,
}


class PolicyServerError(RuntimeError):
    """The server refused or failed a request (e.g. 401, 413, 503 after it stopped)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"policy server answered {status} ({error_type}): {message}")
        self.status = status
        self.error_type = error_type


class HttpTransport:
    """Calls `/v1/<name>` on a policy server from any number of threads."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout_s: float | None = None,
        content_type: str = codec.BINARY,
    ) -> None:
        parts = urlsplit(address if "://" in address else f"http://{address}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"address {address!r}: expected 'http://HOST:PORT' or 'HOST:PORT'")
        self.host, self.port = parts.hostname, parts.port
        self.timeout_s = timeout_s
        self.content_type = content_type
        self._headers = {"Content-Type": content_type, "Accept": content_type}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def post(self, name: str, value: Any) -> Any:
        return self._request("POST", name, codec.encode(value, self.content_type))

    def get(self, name: str) -> Any:
        return self._request("GET", name, None)

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()

    def _request(self, method: str, name: str, body: bytes | None) -> Any:
        connection, reused = self._connection()
        try:
            connection.request(method, API_PREFIX + name, body=body, headers=self._headers)
            response = connection.getresponse()
            payload = response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self._drop_connection()
            if not reused:
                raise
            # The server closed an idle keep-alive connection: once more on a fresh one.
            connection, _ = self._connection()
            connection.request(method, API_PREFIX + name, body=body, headers=self._headers)
            response = connection.getresponse()
            payload = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self._drop_connection()
        response_type = (response.getheader("Content-Type") or codec.JSON).split(";")[0].strip()
        try:
            value = codec.decode(payload, response_type)
        except codec.CodecError:
            value = {"error": payload[:200].decode("utf-8", "replace"), "type": "HTTPError"}
        if response.status != 200:
            error = value if isinstance(value, dict) else {}
            message = str(error.get("error", "no message"))
            error_type = str(error.get("type", "HTTPError"))
            builtin = _BUILTIN_ERRORS.get(error_type)
            if builtin is not None:
                raise builtin(message)
            raise PolicyServerError(response.status, error_type, message)
        return value

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, True
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        self._local.connection = connection
        with self._lock:
            self._connections.append(connection)
        return connection, False

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
