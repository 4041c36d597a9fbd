"""Deadlines for a whole request and a whole answer, not just for each `recv`.

A socket timeout bounds one `recv`: a client sending one byte every few
seconds resets it forever and holds a server worker (slowloris). Here the
connection's reader gives each request a deadline that starts with its first
byte: the request line and headers must arrive within `request_timeout_s`,
the body within another `request_timeout_s` plus its length at
`min_body_rate`. The writer gives each write the same allowance for its size,
so a client that stops reading its answers frees the worker as well.
"""

from __future__ import annotations

import io
import math
import socket
import time

# Request line and headers, from their first byte; also the floor of a body's deadline.
REQUEST_TIMEOUT_S = 10.0
# A body (or an answer) must move at least this fast, on top of the floor: 64 KiB/s.
MIN_BODY_RATE = 64 * 1024


class RequestTimedOut(TimeoutError):
    """A request (or an answer) missed its deadline; the connection must end."""


def check_limits(request_timeout_s: float, min_body_rate: float) -> None:
    """Raises ValueError naming a deadline setting that is not a finite number > 0."""
    for name, value in (("request_timeout_s", request_timeout_s), ("min_body_rate", min_body_rate)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0
        ):
            raise ValueError(f"{name} {value!r}: expected a finite number > 0")


def allowance_s(nbytes: int, request_timeout_s: float, min_body_rate: float) -> float:
    """Seconds allowed to move `nbytes`: the floor plus their time at the minimum rate."""
    return request_timeout_s + nbytes / min_body_rate


class DeadlineReader(io.RawIOBase):
    """A socket's reading side where each request has a total deadline.

    Between requests only the idle timeout applies (per `recv`, as before).
    `expect_request()` arms the next request: its first byte received starts
    the deadline for the head; `expect_body(length)` sets the body's. A `recv`
    past the deadline, or one that stalls for the idle timeout within a
    request, raises `RequestTimedOut` and sets `timed_out`.
    """

    def __init__(self, sock: socket.socket, idle_timeout_s: float, request_timeout_s: float,
                 min_body_rate: float) -> None:
        super().__init__()
        self._sock = sock
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.min_body_rate = min_body_rate
        self._deadline: float | None = None
        self._armed = False
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def expect_request(self) -> None:
        """The next byte received begins a request: it starts the head's deadline."""
        self._deadline, self._armed, self.timed_out = None, True, False

    def expect_body(self, length: int) -> None:
        """The body's `length` bytes must arrive within their allowance, from now."""
        self._armed = False
        allowed = allowance_s(length, self.request_timeout_s, self.min_body_rate)
        self._deadline = time.monotonic() + allowed

    def readinto(self, buffer: memoryview | bytearray) -> int:
        timeout = self.idle_timeout_s
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._time_out()
            timeout = min(timeout, left)
        self._sock.settimeout(timeout)
        try:
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            if self._deadline is not None:
                self._time_out()
            raise  # idle between requests: the connection just ends
        if count and self._armed:
            self._armed = False
            self._deadline = time.monotonic() + self.request_timeout_s
        return count

    def _time_out(self) -> None:
        self.timed_out = True
        self._deadline = None
        raise RequestTimedOut(f"the request did not arrive within its deadline "
                              f"({self.request_timeout_s:g} s for the head, plus the body at "
                              f"{self.min_body_rate:g} bytes/s)")


class DeadlineWriter(io.BufferedIOBase):
    """A socket's writing side (unbuffered) where each write has a deadline for its size.

    `sendall` treats the socket timeout as a total since Python 3.5, so a
    write to a client that does not read raises `TimeoutError` at the end of
    its allowance instead of holding the worker.
    """

    def __init__(self, sock: socket.socket, request_timeout_s: float, min_body_rate: float) -> None:
        super().__init__()
        self._sock = sock
        self.request_timeout_s = request_timeout_s
        self.min_body_rate = min_body_rate

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with memoryview(data) as view:
            allowed = allowance_s(view.nbytes, self.request_timeout_s, self.min_body_rate)
            self._sock.settimeout(allowed)
            self._sock.sendall(view)
            return view.nbytes

    def fileno(self) -> int:
        return self._sock.fileno()
