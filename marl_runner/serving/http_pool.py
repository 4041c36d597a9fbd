"""Bounded capacity for the policy server: a worker pool and a deep backlog.

`ThreadingHTTPServer` starts one thread per connection and listens with a
backlog of 5: 2,000 open connections mean 2,000 threads, and 64 clients
connecting at once see connection resets. Here a fixed number of worker
threads serve connections that have sent a request; silent connections
wait in one selector thread, and beyond that in the kernel's listen backlog
(256), never in new threads. Once a connection has a worker, each request
and each answer has a deadline (`http_deadlines`), so a slow client holds it
for seconds, not for as long as it keeps dripping bytes. Workers are daemon
threads: a worker blocked on a client never holds up the interpreter's exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import queue
import selectors
import socket
import threading
import time
from http.server import HTTPServer
from typing import Any

try:
    import resource
except ImportError:  # not Unix: no open-file limit to read
    resource = None

from marl_runner.serving.client_connections import (
    MAX_CONNECTIONS_PER_CLIENT,
    ClientConnections,
    answer_over_cap,
)
from marl_runner.serving.http_deadlines import MIN_BODY_RATE, REQUEST_TIMEOUT_S, check_limits
from marl_runner.serving.http_linger import MAX_LINGERING, Lingering

LISTEN_BACKLOG = 256
# Connections accepted but silent so far; beyond this they wait in the listen backlog.
MAX_PARKED = 1024


def parking_room(max_parked: int, max_workers: int) -> int:
    """`max_parked`, lowered so that client sockets (with the workers' and `MAX_LINGERING`
    refused ones) take at most half the open-file limit.

    The usual soft limit is 1,024: 1,024 silent connections (no token needed)
    would take every descriptor, and the server could then open no file
    (`--out`), no pipe and no thread-local library: it fails or aborts.
    """
    if resource is None:
        return max_parked
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_parked
    return max(1, min(max_parked, soft // 2 - max_workers - MAX_LINGERING - 1))


class PooledHTTPServer(HTTPServer):
    """An `HTTPServer` whose connections are served by at most `max_workers` threads.

    A new connection is *parked* (one thread watches them all with a
    selector) until it sends its first bytes; only then does it take a
    worker, so connections opened and left silent cost a file descriptor,
    not a thread, and close after `idle_timeout_s`. At most `max_parked`
    connections are parked (fewer where the open-file limit is low:
    `parking_room`); beyond that the accept loop waits and new ones queue in
    the listen backlog. One client address holds at most
    `max_connections_per_client` connections open, parked or served
    (`client_connections`); the accept loop answers one more 503 at once,
    and the parking thread drains it briefly before closing it
    (`http_linger`), so a client still sending reads the answer. `saturated` is true while a connection with
    a request waits for a worker: handlers then close keep-alive connections
    after their current answer, so busy clients take turns.

    A request's line and headers must arrive within `request_timeout_s` of
    its first byte; its body, and each answer, must keep `min_body_rate`
    bytes/s after a `request_timeout_s` head start. A connection that falls
    behind ends (408 when it can still be told) and counts once in
    `requests_timed_out`.
    """

    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        handler: Any,
        max_workers: int,
        idle_timeout_s: float = 5.0,
        max_parked: int = MAX_PARKED,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        min_body_rate: float = MIN_BODY_RATE,
        max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
    ) -> None:
        for name, count in (("max_workers", max_workers), ("max_parked", max_parked)):
            if count < 1:
                raise ValueError(f"{name} {count!r}: expected an int >= 1")
        check_limits(idle_timeout_s=idle_timeout_s, request_timeout_s=request_timeout_s,
                     min_body_rate=min_body_rate)
        self.max_workers = max_workers
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.min_body_rate = min_body_rate
        self.client_connections = ClientConnections(max_connections_per_client)
        self.lingering = Lingering(self.shutdown_request)
        self.requests_timed_out = 0
        self.saturated = False
        self._free = threading.Semaphore(max_workers)
        self.max_parked = parking_room(max_parked, max_workers)
        self._park_slots = threading.Semaphore(self.max_parked)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._arrivals: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._accepting = True
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_writer.setblocking(False)
        super().__init__(address, handler)
        self._parker = threading.Thread(target=self._park, name="marl-runner-http-park", daemon=True)
        self._parker.start()

    @property
    def num_workers(self) -> int:
        """Worker threads started so far (never more than `max_workers`)."""
        return len(self._workers)

    def count_timed_out(self) -> int:
        """Counts a request that missed its deadline; returns the count so far."""
        with self._lock:
            self.requests_timed_out += 1
            return self.requests_timed_out

    def shutdown(self) -> None:
        """Stops the accept loop, also while it waits for room to park a connection.

        With every worker busy and the parking full, that wait lasts until a
        worker frees and a silent connection expires: `close()` waited that
        long before it began its own wait for the requests in progress.
        """
        self._accepting = False
        super().shutdown()

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        """Parks the new connection until it sends something (waiting for room to park it);
        one over its client's cap is answered 503 and left to linger (`http_linger`) instead,
        or closed at once when too many linger already."""
        connections = self.client_connections
        if not connections.admit(request, client_address[0]):
            answer_over_cap(request, connections.max_per_client)
            if self.lingering.offer(request):
                self._wake()
            else:
                self.shutdown_request(request)
            return
        while not self._park_slots.acquire(timeout=0.1):
            if self._closing.is_set() or not self._accepting:
                self.shutdown_request(request)
                return
        self._arrivals.put((request, client_address))
        self._wake()

    def shutdown_request(self, request: socket.socket) -> None:
        """Closes a connection and frees its client's slot: every connection ends here."""
        self.client_connections.release(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Stops accepting, closes parked connections; workers end after their current one."""
        self._closing.set()
        self._wake()
        super().server_close()
        self._parker.join(5)
        while True:  # accepted as closing began: the parking thread ended without them
            try:
                request, _ = self._arrivals.get_nowait()
            except queue.Empty:
                break
            self.shutdown_request(request)
        for _ in self._workers:
            self._jobs.put(None)
        self._wake_reader.close()
        self._wake_writer.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            self._wake_writer.send(b"\0")

    def _park(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_reader, selectors.EVENT_READ)
        parked: dict[socket.socket, tuple[Any, float]] = {}  # oldest first
        try:
            while not self._closing.is_set():
                while True:
                    try:
                        request, client_address = self._arrivals.get_nowait()
                    except queue.Empty:
                        break
                    parked[request] = (client_address, time.monotonic())
                    selector.register(request, selectors.EVENT_READ)
                self.lingering.watch(selector)
                for key, _ in selector.select(timeout=0.1):
                    if key.fileobj is self._wake_reader:
                        with contextlib.suppress(OSError):
                            self._wake_reader.recv(4096)
                        continue
                    if key.data is self.lingering:
                        self.lingering.read(key.fileobj, selector)
                        continue
                    request = key.fileobj
                    selector.unregister(request)
                    client_address, _ = parked.pop(request)
                    self._park_slots.release()
                    self._dispatch(request, client_address)
                expired = time.monotonic() - self.idle_timeout_s
                for request, (_, since) in list(parked.items()):
                    if since > expired:
                        break
                    selector.unregister(request)
                    del parked[request]
                    self._park_slots.release()
                    self.shutdown_request(request)
                self.lingering.expire(selector)
        finally:
            for request in parked:
                self.shutdown_request(request)
            self.lingering.close_all(selector)
            selector.close()

    def _dispatch(self, request: socket.socket, client_address: Any) -> None:
        """Hands a connection with a request to a free worker, waiting for one."""
        while not self._free.acquire(timeout=0.1):
            self.saturated = True
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        self.saturated = False
        with self._lock:
            if self._idle == 0 and len(self._workers) < self.max_workers:
                worker = threading.Thread(
                    target=self._work, name=f"marl-runner-http-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
                worker.start()
            else:
                self._idle -= 1
        self._jobs.put((request, client_address))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            request, client_address = job
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                with self._lock:
                    self._idle += 1
                self._free.release()


def _load_malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> None:
    """Returns freed heap memory to the OS (glibc only; elsewhere nothing to do).

    Each worker thread allocates from its own glibc arena, which keeps what a
    big body freed: without this, RSS grows by a body's decoding cost per
    worker that ever decoded one, though only one decodes at a time.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
