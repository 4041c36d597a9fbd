"""Refused connections, answered and half-closed, drained for a moment before they close.

The accept loop answers a connection over its client's cap
(`client_connections`) before reading its request. Closing it then, while
the client still sends a request body, resets the connection: the client
fails on its send and never reads the 503 that asked it to retry (an upload
of megabytes almost always did). So the accept loop answers, shuts the write
side and hands the socket here; the parking thread reads and drops what
arrives until the client closes or `LINGER_S` passes, then closes it. At
most `MAX_LINGERING` sockets linger at once; one more is closed at once, so
refused sockets never pile up. Nothing here blocks: the accept loop only
queues a socket, and the parking thread reads only what its selector says
has arrived.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable

from marl_runner.serving.http_deadlines import check_counts, check_limits

# A refused client on a fast link has sent megabytes by then; one still sending after it
# gets the reset (a `PolicyClient` then reads the answer that came before it).
LINGER_S = 0.5
MAX_LINGERING = 16
READ_BYTES = 256 * 1024


class Lingering:
    """Answered sockets, each drained until its client closes or `linger_s` passes.

    `offer(sock)` may be called from any thread (the accept loop); the rest
    only from the thread that owns `selector` (the parking thread), which
    calls `watch` for new sockets, `read` when one is readable (its key's
    `data` is this object), `expire` each round, and `close_all` at the end.
    Every socket ends in `close` (the server's `shutdown_request`).
    """

    def __init__(
        self,
        close: Callable[[socket.socket], None],
        max_lingering: int = MAX_LINGERING,
        linger_s: float = LINGER_S,
    ) -> None:
        check_counts(max_lingering=max_lingering)
        check_limits(linger_s=linger_s)
        self.linger_s = linger_s
        self._close = close
        self._slots = threading.Semaphore(max_lingering)
        self._offered: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._until: dict[socket.socket, float] = {}  # oldest first
        self._buffer = bytearray(READ_BYTES)

    @property
    def num_lingering(self) -> int:
        """Sockets the parking thread drains now."""
        return len(self._until)

    def offer(self, sock: socket.socket) -> bool:
        """Queues `sock` (answered, its write side shut) to linger; False when `MAX_LINGERING`
        already do: the caller closes it at once."""
        if not self._slots.acquire(blocking=False):
            return False
        sock.setblocking(False)
        self._offered.put(sock)
        return True

    def watch(self, selector: selectors.BaseSelector) -> None:
        """Starts draining the sockets offered since the last call."""
        while True:
            try:
                sock = self._offered.get_nowait()
            except queue.Empty:
                return
            self._until[sock] = time.monotonic() + self.linger_s
            selector.register(sock, selectors.EVENT_READ, self)

    def read(self, sock: socket.socket, selector: selectors.BaseSelector) -> None:
        """Drops what `sock` sent; closes it once its client closed (or reset) it."""
        try:
            count = sock.recv_into(self._buffer)
        except BlockingIOError:
            return
        except OSError:
            count = 0
        if not count:
            self._end(sock, selector)

    def expire(self, selector: selectors.BaseSelector) -> None:
        """Closes the sockets that lingered `linger_s`."""
        now = time.monotonic()
        for sock, until in list(self._until.items()):
            if until > now:
                return
            self._end(sock, selector)

    def close_all(self, selector: selectors.BaseSelector) -> None:
        """Closes every socket, drained or still queued (the server is closing)."""
        self.watch(selector)
        for sock in list(self._until):
            self._end(sock, selector)

    def _end(self, sock: socket.socket, selector: selectors.BaseSelector) -> None:
        selector.unregister(sock)
        del self._until[sock]
        self._close(sock)
        self._slots.release()
