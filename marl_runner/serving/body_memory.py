"""The policy server's memory budget for request bodies, reserved as the bytes arrive.

Reserving a body's whole decoding cost (6x its size for JSON) when its
headers arrive let one client that declared 64 MB and then sent at the
minimum rate hold the whole default budget for 17 minutes, while every other
upload waited and got 503. Here a request holds only what it has received
(plus one `READ_STEP` ahead) while its body arrives, and its decoding cost
only once the body is complete.

Growing reservations can deadlock: two uploads whose decoding costs each
need most of the budget could both read half their bodies and then wait for
each other forever. Each request therefore declares its most (`claim`, its
decoding cost, capped at the budget) when it opens, and a reservation grows
only if the budget stays *safe* afterwards (the banker's algorithm): some
order exists in which every open request can still grow to its claim and
finish. Uploads that together fit are served side by side; ones that do not
take turns, as they did when the whole cost was reserved up front.
"""

from __future__ import annotations

import threading

# How far a reservation runs ahead of the bytes received: at the minimum body rate
# (64 KiB/s) a slow client holds at most 4 s worth of bytes it has not sent yet.
READ_STEP = 256 * 1024


class BodyReservation:
    """One request's share of a `BodyBudget`: `held` bytes now, at most `claim` bytes ever."""

    __slots__ = ("budget", "claim", "held")

    def __init__(self, budget: BodyBudget, claim: int) -> None:
        self.budget, self.claim, self.held = budget, claim, 0

    def grow_to(self, nbytes: int, timeout_s: float) -> bool:
        """Holds `nbytes` (capped at `claim`) once that leaves the budget safe; False when no
        room came within `timeout_s` (what is held stays held)."""
        return self.budget._grow(self, min(nbytes, self.claim), timeout_s)

    def close(self) -> None:
        """Gives back everything held; the request is done with the budget."""
        self.budget._close(self)


class BodyBudget:
    """Bytes of request bodies in flight (weighted by their decoding cost), bounded.

    `open(claim)` starts a request's `BodyReservation`; it grows as its body
    arrives and to its whole claim before decoding, never past `max_bytes`
    in total, and only while every open request can still finish (see the
    module docstring). `refused` counts growths that found no room in time.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes {max_bytes!r}: expected an int >= 1")
        self.max_bytes = max_bytes
        self.in_flight = 0
        self.refused = 0
        self._open: set[BodyReservation] = set()
        self._claimed = 0  # the sum of the open claims: while <= max_bytes, every state is safe
        self._room = threading.Condition()

    @property
    def num_open(self) -> int:
        """Requests holding (or waiting for) a share of the budget now."""
        return len(self._open)

    def open(self, claim: int) -> BodyReservation:
        """A reservation holding nothing yet, for a request that may need `claim` bytes (capped
        at the budget: a body costlier than the whole budget is decoded alone)."""
        reservation = BodyReservation(self, min(max(claim, 0), self.max_bytes))
        with self._room:
            self._open.add(reservation)
            self._claimed += reservation.claim
        return reservation

    def _grow(self, reservation: BodyReservation, nbytes: int, timeout_s: float) -> bool:
        with self._room:
            if reservation not in self._open:
                raise ValueError("this body reservation was closed: open a new one")
            extra = nbytes - reservation.held
            if extra <= 0:
                return True
            if not self._room.wait_for(lambda: self._safe(reservation, extra), timeout_s):
                self.refused += 1
                return False
            reservation.held += extra
            self.in_flight += extra
            return True

    def _safe(self, reservation: BodyReservation, extra: int) -> bool:
        """Whether `reservation` may take `extra` more bytes: the total stays within the budget
        and, taking the open requests by what each still needs, smallest first, each fits in
        what is free once those before it finished (one resource: that order is the best)."""
        free = self.max_bytes - self.in_flight - extra
        if free < 0:
            return False
        if self._claimed <= self.max_bytes:
            return True
        needs = sorted(
            (r.claim - r.held - (extra if r is reservation else 0),
             r.held + (extra if r is reservation else 0))
            for r in self._open
        )
        for need, held in needs:
            if need > free:
                return False
            free += held
        return True

    def _close(self, reservation: BodyReservation) -> None:
        with self._room:
            if reservation not in self._open:
                return
            self._open.remove(reservation)
            self._claimed -= reservation.claim
            self.in_flight -= reservation.held
            reservation.held = 0
            self._room.notify_all()
