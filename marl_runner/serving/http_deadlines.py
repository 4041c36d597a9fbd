"""Deadlines for a whole request and a whole answer, not just for each `recv`.

A socket timeout bounds one `recv`: a client sending one byte every few
seconds resets it forever and holds a server worker (slowloris). Here the
connection's reader gives each request a deadline that starts with its first
byte: the request line and headers must arrive within `request_timeout_s`.
A body, and every answer, must then keep a minimum rate: its next byte is
due `request_timeout_s` plus the bytes moved so far at `min_body_rate` after
it began. A client at full speed never notices; one that trickles (or stops
reading its answer) is cut off after about `request_timeout_s`, however big
the body it declared, so it holds neither a worker nor a body's memory.
A head is also capped at `MAX_HEAD_BYTES`: `http.server` alone takes 100
header lines of 64 KiB each, 6.5 MB a connection outside the body budget.
"""

from __future__ import annotations

import io
import math
import socket
import time

# Request line and headers, from their first byte; also the head start of a body or answer.
REQUEST_TIMEOUT_S = 10.0
# A body (or an answer) must move at least this fast after that head start: 64 KiB/s.
MIN_BODY_RATE = 64 * 1024
# Request line and headers together (PolicyClient sends a few hundred bytes).
MAX_HEAD_BYTES = 64 * 1024
# A body read only to be dropped after its answer went out ends at its first second without a
# byte: a client that waits for the answer costs the worker that long, not a deadline.
DRAIN_QUIET_S = 1.0


class RequestTimedOut(TimeoutError):
    """A request (or an answer) missed its deadline; the connection must end."""


class HeadTooLarge(ValueError):
    """The request line and headers went past `MAX_HEAD_BYTES`; the connection must end."""


def check_limits(**limits: float) -> None:
    """Raises ValueError naming a timeout or rate that is not a finite number > 0.

    0 would make a socket non-blocking (or a rate divide by zero), and a
    negative timeout fails only at the first `recv`, inside a worker.
    """
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0
        ):
            raise ValueError(f"{name} {value!r}: expected a finite number > 0")


def check_counts(**counts: int) -> None:
    """Raises ValueError naming a count setting that is not an int >= 1 (bools refused)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} {value!r}: expected an int >= 1")


class _Pace:
    """When the next byte is due: `head_start_s` after `began`, plus `moved` bytes at `rate`."""

    __slots__ = ("began", "head_start_s", "rate", "moved")

    def __init__(self, head_start_s: float, rate: float) -> None:
        self.began = time.monotonic()
        self.head_start_s, self.rate, self.moved = head_start_s, rate, 0

    def left_s(self) -> float:
        """Seconds until the next byte is due (<= 0: too late)."""
        return self.began + self.head_start_s + self.moved / self.rate - time.monotonic()


class DeadlineReader(io.RawIOBase):
    """A socket's reading side where each request has a deadline, not just each `recv`.

    Between requests only the idle timeout applies (per `recv`, as before).
    `expect_request()` arms the next request: its first byte received starts
    the head's fixed deadline; `expect_body()` sets the body's pace (`excuse()`
    moves it on by time the server made the body wait). A `recv`
    past due, or one that stalls for the idle timeout within a request,
    raises `RequestTimedOut` and sets `timed_out`; a head still unfinished
    after `MAX_HEAD_BYTES` raises `HeadTooLarge`. `expect_drain()` is the
    body's pace for bytes read only to be dropped after the answer: there a
    quiet `recv` or one past due reads as the end, not as a missed deadline.
    """

    def __init__(self, sock: socket.socket, idle_timeout_s: float, request_timeout_s: float,
                 min_body_rate: float) -> None:
        super().__init__()
        self._sock = sock
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.min_body_rate = min_body_rate
        self._pace: _Pace | None = None
        self._armed = False  # waiting for a request's first byte
        self._in_head = False  # reading a request's line and headers
        self._quiet_s: float | None = None  # draining: a recv this quiet is the end
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def expect_request(self) -> None:
        """The next byte received begins a request: it starts the head's deadline."""
        self._pace, self._armed, self._in_head, self.timed_out = None, True, False, False
        self._quiet_s = None

    def expect_body(self) -> None:
        """From now, the body must arrive at `min_body_rate` after a `request_timeout_s` start."""
        self._armed = self._in_head = False
        self._pace = _Pace(self.request_timeout_s, self.min_body_rate)
        self._quiet_s = None

    def expect_drain(self, quiet_s: float = DRAIN_QUIET_S) -> None:
        """From now, reads (0 at the end) take what the client sends after its answer: at the
        body's pace, ending at the first `quiet_s` without a byte or once past due."""
        self.expect_body()
        self._quiet_s = quiet_s

    def excuse(self, seconds: float) -> None:
        """Moves the body's deadline `seconds` later: the server made it wait (for memory)."""
        if self._pace is not None:
            self._pace.began += seconds

    def readinto(self, buffer: memoryview | bytearray) -> int:
        if self._quiet_s is not None:
            return self._drain_into(buffer)
        pace = self._pace
        timeout = self.idle_timeout_s
        if pace is not None:
            if self._in_head and pace.moved >= MAX_HEAD_BYTES:
                self._pace, self._in_head = None, False
                raise HeadTooLarge(f"the request line and headers are over {MAX_HEAD_BYTES} bytes")
            left = pace.left_s()
            if left <= 0:
                self._time_out()
            timeout = min(timeout, left)
        self._sock.settimeout(timeout)
        try:
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            if pace is not None:
                self._time_out()
            raise  # idle between requests: the connection just ends
        if pace is not None:
            pace.moved += count
        elif count and self._armed:
            self._armed, self._in_head = False, True
            self._pace = _Pace(self.request_timeout_s, math.inf)
            self._pace.moved = count
        return count

    def _drain_into(self, buffer: memoryview | bytearray) -> int:
        """One `recv` of bytes to drop; 0 (the end) when quiet for `_quiet_s` or past due."""
        left = self._pace.left_s()
        if left <= 0:
            return 0
        self._sock.settimeout(min(self._quiet_s, left))
        try:
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            return 0
        self._pace.moved += count
        return count

    def _time_out(self) -> None:
        self.timed_out, self._in_head = True, False
        self._pace = None
        raise RequestTimedOut(f"the request did not arrive in time ({self.request_timeout_s:g} s "
                              f"for the head; the body at {self.min_body_rate:g} bytes/s after "
                              f"that long)")


class DeadlineWriter(io.BufferedIOBase):
    """A socket's writing side (unbuffered) where each write keeps the minimum rate.

    A write to a client that stops reading raises `RequestTimedOut` (a
    `TimeoutError`) once it falls behind: about `request_timeout_s` after the
    kernel's buffers fill, however big the answer.
    """

    def __init__(self, sock: socket.socket, request_timeout_s: float, min_body_rate: float) -> None:
        super().__init__()
        self._sock = sock
        self.request_timeout_s = request_timeout_s
        self.min_body_rate = min_body_rate

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        pace = _Pace(self.request_timeout_s, self.min_body_rate)
        with memoryview(data) as whole, whole.cast("B") as view:
            while pace.moved < len(view):
                left = pace.left_s()
                if left <= 0:
                    raise RequestTimedOut(f"the client read {pace.moved} of {len(view)} bytes "
                                          f"of the answer, slower than {self.min_body_rate:g} "
                                          "bytes/s")
                self._sock.settimeout(left)
                pace.moved += self._sock.send(view[pace.moved:])
            return len(view)

    def fileno(self) -> int:
        return self._sock.fileno()
