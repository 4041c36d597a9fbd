"""Stand-in HTTP servers on loopback, for tests of what a client does with odd answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from marl_runner.serving import codec


@contextmanager
def serving_on_loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` serving on 127.0.0.1 (a free port) in a thread; yields the base URL and
    shuts the server down afterwards."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


class ScriptedHandler(BaseHTTPRequestHandler):
    """A stand-in policy server. Each request to the `scripted` call (every call when None)
    takes the next step of `script`: "drop" (the connection closes unanswered), an int
    status (an error body naming `error_type(status)`; a 503 says `Retry-After: 0`), or 200
    with `answer(name)`; other requests get 200. Keeps each request as (method, call name,
    decoded body or None) in `requests`. Subclass to change `answer` or `error_type`."""

    protocol_version = "HTTP/1.1"
    scripted: str | None = None
    script: list[Any] = []
    requests: list[tuple[str, str, Any]] = []

    def answer(self, name: str) -> Any:
        return {"ok": True}

    def error_type(self, status: int) -> str:
        return "HTTPError"

    def do_GET(self) -> None:
        self._serve(None)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._serve(codec.decode(raw, self.headers["Content-Type"]))

    def _serve(self, body: Any) -> None:
        name = self.path.rsplit("/", 1)[1]
        self.requests.append((self.command, name, body))
        step = self.script.pop(0) if self.script and self.scripted in (None, name) else 200
        if step == "drop":
            self.close_connection = True
            return
        value = self.answer(name) if step == 200 else {"error": "refused", "type": self.error_type(step)}
        payload = json.dumps(value).encode()
        self.send_response(step)
        self.send_header("Content-Type", codec.JSON)
        self.send_header("Content-Length", str(len(payload)))
        if step == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def scripted_server(handler: type[ScriptedHandler], script: list[Any]) -> Iterator[str]:
    """`handler` on loopback with a fresh `script` and record; yields the base URL."""
    handler.script, handler.requests = list(script), []
    with serving_on_loopback(handler) as address:
        yield address
