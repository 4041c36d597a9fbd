"""A cap on the connections one client address holds open in the policy server.

Without it one host could open connections up to the parking limit (1,024,
or half the open-file limit) and every other client would wait in the
listen backlog behind them. A connection counts from the moment it is
accepted until it is closed, parked (silent) or served alike; every
connection ends in `PooledHTTPServer.shutdown_request` (answered, idle,
timed out, reset, refused, or closed with the server), which frees its slot.
A connection over the cap is answered 503 with `Retry-After` by the accept
loop itself, then drained for a moment and closed (`http_linger`): it holds
no thread, no parking slot and no place in the cap.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time

from marl_runner.serving.http_deadlines import check_counts

logger = logging.getLogger(__name__)

# One address's connections at most. A remote-mode PolicyClient holds one keep-alive
# connection per thread, so a simulator host running 64 episodes at once fits; the usual
# open-file limit (1,024) leaves room to park about 430 connections, so one host at the cap
# leaves most of it to the others. `PolicyServer` raises it to num_envs + 16 when that is more.
MAX_CONNECTIONS_PER_CLIENT = 64
RETRY_AFTER_S = 1
# A client refused again and again gets one log line per this many seconds, not one each time.
LOG_EVERY_S = 10.0


class _Client:
    """One address's open connections and the log state of its refusals."""

    __slots__ = ("open", "logged_at", "unlogged")

    def __init__(self) -> None:
        self.open, self.logged_at, self.unlogged = 0, -float("inf"), 0


class ClientConnections:
    """Open connections per client address, at most `max_per_client` each.

    `admit(sock, address)` counts a new connection or, over the cap, counts
    a refusal (`refused`) and returns False; `release(sock)` frees its slot
    (a second release of the same socket, or one never admitted, does
    nothing). Refusals are logged once per burst: the first, then at most
    one line per `LOG_EVERY_S` per address with how many came since.
    """

    def __init__(self, max_per_client: int) -> None:
        check_counts(max_connections_per_client=max_per_client)
        self.max_per_client = max_per_client
        self.refused = 0
        self._clients: dict[str, _Client] = {}
        self._address_of: dict[socket.socket, str] = {}
        self._lock = threading.Lock()

    @property
    def num_open(self) -> int:
        """Connections open now, from every address."""
        with self._lock:
            return len(self._address_of)

    def open_from(self, address: str) -> int:
        """Connections open now from `address`."""
        with self._lock:
            client = self._clients.get(address)
            return 0 if client is None else client.open

    def admit(self, sock: socket.socket, address: str) -> bool:
        """Counts `sock` as open from `address`; False (and counted as refused) over the cap."""
        with self._lock:
            client = self._clients.setdefault(address, _Client())
            if client.open < self.max_per_client:
                client.open += 1
                self._address_of[sock] = address
                return True
            self.refused += 1
            client.unlogged += 1
            now = time.monotonic()
            if now - client.logged_at < LOG_EVERY_S:
                return False
            client.logged_at, unlogged = now, client.unlogged
            client.unlogged = 0
        logger.info(
            "refusing connections from %s with 503: it has %d open, the most one client may "
            "(max_connections_per_client); %d refused since the last message, %d from all "
            "clients so far", address, self.max_per_client, unlogged, self.refused,
        )
        return False

    def release(self, sock: socket.socket) -> None:
        """Frees the slot `sock` held, once; its address's record goes with its last one."""
        with self._lock:
            address = self._address_of.pop(sock, None)
            if address is None:
                return
            client = self._clients[address]
            client.open -= 1
            if client.open == 0:
                del self._clients[address]


def answer_over_cap(sock: socket.socket, max_per_client: int) -> None:
    """Writes the 503 for a connection over the cap and shuts the write side, without ever
    blocking the accept loop; the caller drains what the client still sends (`http_linger`)
    before closing, since closing with unread bytes resets the connection and can hide the
    answer from a client still sending its request."""
    body = json.dumps({
        "error": "this address already has as many connections open as the server allows "
                 f"one client ({max_per_client}); close one or retry in a moment",
        "type": "HTTPError",
    }).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER_S}\r\n"
        "Connection: close\r\n\r\n"
    )
    sock.setblocking(False)
    with contextlib.suppress(OSError):  # a fresh socket's send buffer takes it whole
        sock.send(head.encode() + body)
    with contextlib.suppress(OSError):  # already reset by the client
        sock.shutdown(socket.SHUT_WR)
