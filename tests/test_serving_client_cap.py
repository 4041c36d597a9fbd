"""One client address holds at most `max_connections_per_client` connections open.

Without a cap one host could open connections up to the parking limit and
every other client waited in the listen backlog. Linux routes all of
127.0.0.0/8 to the loopback interface, so a socket bound to 127.0.0.2 is
another client address than 127.0.0.1.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marl_runner.serving.client_connections import ClientConnections
from tests.test_serving_expect_continue import read_response
from tests.test_serving_http import served, wait_for

HEALTH = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def connect(address: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    """A connection to `address` from the client address `source`."""
    return socket.create_connection(address, timeout=5, source_address=(source, 0))


@pytest.fixture
def second_address() -> str:
    """127.0.0.2, or a skip where this machine cannot bind it."""
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.2", 0))
    except OSError as exc:
        pytest.skip(f"cannot bind 127.0.0.2 as a second client address ({exc}): only Linux "
                    "routes all of 127.0.0.0/8 to the loopback interface")
    finally:
        probe.close()
    return "127.0.0.2"


@contextmanager
def open_connections(address: tuple[str, int], count: int) -> Iterator[list[socket.socket]]:
    sockets = [connect(address) for _ in range(count)]
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def health_from(address: tuple[str, int], source: str = "127.0.0.1") -> str:
    with connect(address, source) as sock, sock.makefile("rb") as reader:
        sock.sendall(HEALTH)
        return read_response(reader)[0]


def test_over_the_cap_an_address_gets_503_at_once_while_another_is_served(second_address,
                                                                          caplog):
    caplog.set_level(logging.INFO, "marl_runner.serving.client_connections")
    with served(max_connections_per_client=3, idle_timeout_s=30) as handle:
        connections = handle.server.client_connections
        address = handle.server.server_address_tuple()
        with open_connections(address, 3) as silent:
            wait_for(lambda: connections.open_from("127.0.0.1") == 3)
            for _ in range(3):  # answered without sending anything: no worker, no parking
                with connect(address) as sock, sock.makefile("rb") as reader:
                    line, headers, _ = read_response(reader)
                    assert line.startswith("HTTP/1.1 503 "), line
                    assert headers["retry-after"] == "1" and headers["connection"] == "close"
                    assert reader.read() == b""  # closed at once
            assert connections.refused == 3 and connections.open_from("127.0.0.1") == 3
            assert health_from(address, second_address) == "HTTP/1.1 200 OK"
            silent[0].close()  # a closed connection frees its slot
            wait_for(lambda: connections.open_from("127.0.0.1") == 2)
            assert health_from(address) == "HTTP/1.1 200 OK"
        wait_for(lambda: connections.num_open == 0)
    refusals = [r for r in caplog.records if "refusing connections from" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # once per burst
    assert "127.0.0.1" in refusals[0].getMessage()


def test_every_way_a_connection_ends_frees_its_slot():
    limits = {"max_connections_per_client": 4, "idle_timeout_s": 0.5, "request_timeout_s": 1.0}
    with served(**limits) as handle:
        connections = handle.server.client_connections
        address = handle.server.server_address_tuple()
        silent = connect(address)  # expires while parked
        stalled = connect(address)  # a head left unfinished: 408 once it stalls
        stalled.sendall(b"POST /v1/start_episode HTTP/1.1\r\n")
        with connect(address) as reset:  # a body cut off by a reset
            reset.sendall(b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: 1000\r\n\r\n{")
            wait_for(lambda: handle.server.body_budget.num_open == 1)  # the body is being read
            reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with connect(address) as bad, bad.makefile("rb") as reader:  # 400, kept alive, idles out
            bad.sendall(b"POST /v1/start_episode HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        b"application/json\r\nContent-Length: 5\r\n\r\n{nope")
            assert read_response(reader)[0] == "HTTP/1.1 400 Bad Request"
            assert reader.read() == b""
        try:
            with stalled.makefile("rb") as reader:
                assert read_response(reader)[0] == "HTTP/1.1 408 Request Timeout"
            assert silent.recv(1) == b""
            wait_for(lambda: connections.num_open == 0)
        finally:
            silent.close()
            stalled.close()
        assert connections._clients == {} and connections._address_of == {}


def test_closing_the_server_frees_every_slot():
    # The parked one never expires on its own here; the busy one's head times out after 1 s.
    with served(idle_timeout_s=30, request_timeout_s=1.0) as handle:
        connections = handle.server.client_connections
        address = handle.server.server_address_tuple()
        parked = connect(address)
        busy = connect(address)
        busy.sendall(b"GET /v1/health HTTP/1.1\r\n")  # a worker waits for the rest
        wait_for(lambda: connections.num_open == 2)
    try:
        wait_for(lambda: connections.num_open == 0)
    finally:
        parked.close()
        busy.close()


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 3),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 9)),
                      max_size=40))
def test_the_counts_follow_any_sequence_of_opens_and_closes(cap, steps):
    connections = ClientConnections(cap)
    sockets = [object() for _ in range(10)]
    open_now: dict[object, str] = {}
    refused = 0
    for is_open, client, index in steps:
        sock, address = sockets[index], f"10.0.0.{client}"
        if is_open and sock not in open_now:
            if sum(a == address for a in open_now.values()) < cap:
                assert connections.admit(sock, address)
                open_now[sock] = address
            else:
                assert not connections.admit(sock, address)
                refused += 1
        else:  # a close, maybe of a socket closed already or never admitted: nothing changes
            connections.release(sock)
            open_now.pop(sock, None)
        for name in {f"10.0.0.{c}" for c in range(3)}:
            assert connections.open_from(name) == sum(a == name for a in open_now.values())
    assert connections.num_open == len(open_now) and connections.refused == refused
    for sock in sockets:
        connections.release(sock)
    assert connections.num_open == 0 and connections._clients == {}


def test_the_counts_stay_exact_under_concurrent_opens_and_closes():
    connections = ClientConnections(5)
    errors: list[AssertionError] = []

    def client(address: str) -> None:
        for _ in range(300):
            mine = [s for s in (object() for _ in range(7)) if connections.admit(s, address)]
            if len(mine) != 5:
                errors.append(AssertionError(f"{address}: admitted {len(mine)} of 7, cap 5"))
            for sock in mine:
                connections.release(sock)

    threads = [threading.Thread(target=client, args=(f"10.0.0.{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors[:3]
    assert connections.num_open == 0 and connections.refused == 4 * 300 * 2


@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_a_cap_that_is_not_an_int_of_at_least_1_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=rf"max_connections_per_client {value!r}: expected an "
                                         r"int >= 1"):
        ClientConnections(value)
