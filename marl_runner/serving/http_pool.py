"""Bounded capacity for the policy server: a worker pool, a deep backlog, a body-memory budget.

`ThreadingHTTPServer` starts one thread per connection and listens with a
backlog of 5: 2,000 open connections mean 2,000 threads, and 64 clients
connecting at once see connection resets. Here a fixed number of worker
threads serve connections; while all are busy the accept loop stops
accepting, so new connections wait in the kernel's listen backlog (256)
instead of in new threads. Workers are daemon threads: a worker blocked on a
client never holds up the interpreter's exit.
"""

from __future__ import annotations

import queue
import socket
import threading
from http.server import HTTPServer
from typing import Any

LISTEN_BACKLOG = 256


class PooledHTTPServer(HTTPServer):
    """An `HTTPServer` whose connections are served by at most `max_workers` threads.

    `saturated` is true while a connection waits for a free worker: handlers
    then close keep-alive connections after their current request, so busy
    clients take turns instead of pinning every worker.
    """

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: Any, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers {max_workers!r}: expected an int >= 1")
        self.max_workers = max_workers
        self._free = threading.Semaphore(max_workers)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.saturated = False
        super().__init__(address, handler)

    @property
    def num_workers(self) -> int:
        """Worker threads started so far (never more than `max_workers`)."""
        return len(self._workers)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        """Hands the connection to a free worker, waiting for one (the backlog fills meanwhile)."""
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

    def server_close(self) -> None:
        """Stops accepting and lets every worker end after its current connection."""
        self._closing.set()
        super().server_close()
        for _ in self._workers:
            self._jobs.put(None)

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


class BodyBudget:
    """Bytes of request bodies in flight (weighted by their decoding cost), bounded.

    Each request reserves an estimate of the memory its body takes while it
    is decoded and checked; a reservation waits for room, and one larger than
    the whole budget waits until it runs alone.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes {max_bytes!r}: expected an int >= 1")
        self.max_bytes = max_bytes
        self.in_flight = 0
        self._room = threading.Condition()

    def reserve(self, nbytes: int, timeout_s: float) -> int | None:
        """Reserves `nbytes` (capped at the budget); None when no room came within `timeout_s`."""
        nbytes = min(max(nbytes, 0), self.max_bytes)
        with self._room:
            if not self._room.wait_for(lambda: self.in_flight + nbytes <= self.max_bytes, timeout_s):
                return None
            self.in_flight += nbytes
        return nbytes

    def release(self, nbytes: int) -> None:
        """Gives back a reservation made by `reserve`."""
        with self._room:
            self.in_flight -= nbytes
            self._room.notify_all()
