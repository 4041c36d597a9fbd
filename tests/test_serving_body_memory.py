"""The body-memory budget is reserved as a body arrives: a slow giant upload holds what it sent,
not its whole decoding cost, so normal uploads keep being served beside it.

Reserving 6x the declared size when the headers came let one client declaring 64 MB of JSON
and sending at the minimum rate hold the whole default budget for ~17 minutes.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marl_runner.serving import codec, http_handler
from marl_runner.serving.body_memory import BodyBudget, BodyReservation
from tests.test_serving_http import served, wait_for

STEP = 4096  # READ_STEP in these tests: reservations grow in small steps
LIMITS = {"max_body_bytes": 100_000, "max_bytes_in_flight": 600_000}


def head(length: int, path: str = "/v1/start_episode") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {codec.JSON}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def padded_json(length: int) -> bytes:
    """`{}` and spaces: a valid start_episode body of exactly `length` bytes."""
    return b"{}" + b" " * (length - 2)


def post(address: tuple[str, int], body: bytes) -> tuple[int, str | None, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=30)
    try:
        connection.request("POST", "/v1/start_episode", body, {"Content-Type": codec.JSON})
        response = connection.getresponse()
        return response.status, response.getheader("Retry-After"), response.read()
    finally:
        connection.close()


def status_line(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    return sock.makefile("rb").readline()


@pytest.fixture(autouse=True)
def small_steps(monkeypatch):
    monkeypatch.setattr(http_handler, "READ_STEP", STEP)


def test_a_slow_giant_upload_does_not_make_normal_uploads_wait_or_fail():
    giant = padded_json(100_000)  # decoding cost 600 KB: the whole budget
    with served(**LIMITS, request_timeout_s=30.0) as handle:
        handle.server.body_wait_s = 1.0  # a normal upload that had to wait would get 503
        budget = handle.server.body_budget
        address = handle.server.server_address_tuple()
        with socket.create_connection(address, timeout=30) as slow:
            slow.sendall(head(len(giant)) + giant[:1000])
            wait_for(lambda: budget.in_flight == STEP)  # what it sent, rounded up to a step
            slow.sendall(giant[1000:6000])
            wait_for(lambda: budget.in_flight == 2 * STEP)  # grows as the bytes come in
            for _ in range(3):  # 20 KB each: decoding cost 120 KB
                status, _, answer = post(address, padded_json(20_000))
                assert status == 200, answer
            wait_for(lambda: budget.in_flight == 2 * STEP)  # the giant is still in progress
            slow.sendall(giant[6000:])  # then finishes: decoded alone, answered
            assert status_line(slow) == b"HTTP/1.1 200 OK\r\n"
        wait_for(lambda: budget.in_flight == 0 and budget.num_open == 0)
        assert budget.refused == 0


def test_big_uploads_that_cannot_decode_together_take_turns_instead_of_deadlocking():
    # Each costs 540 KB of a 600 KB budget: read side by side, both would wait for the other.
    with served(**LIMITS) as handle:
        handle.server.body_wait_s = 20.0
        address = handle.server.server_address_tuple()
        answers: list = []
        senders = [threading.Thread(target=lambda: answers.append(post(address,
                                                                       padded_json(90_000))))
                   for _ in range(3)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
        assert [status for status, _, _ in answers] == [200, 200, 200], answers
        wait_for(lambda: handle.server.body_budget.in_flight == 0)  # released after answering


def test_a_body_refused_mid_way_for_lack_of_room_frees_it_and_gets_503_once():
    with served(**LIMITS) as handle:
        handle.server.body_wait_s = 0.3
        budget = handle.server.body_budget
        # Another request holds 580 KB and may still need 10 KB: after 8 KB of this body,
        # a third step would leave too little for either to finish.
        other = budget.open(590_000)
        assert other.grow_to(580_000, 1.0)
        body = padded_json(20_000)
        with socket.create_connection(handle.server.server_address_tuple(), timeout=30) as sock:
            sock.sendall(head(len(body)) + body)
            reply = sock.makefile("rb")
            assert reply.readline() == b"HTTP/1.1 503 Service Unavailable\r\n"
            headers = http.client.parse_headers(reply)
            assert headers["Retry-After"] == "1" and headers.get("Connection") is None
            assert "retry" in json.loads(reply.read(int(headers["Content-Length"])))["error"]
            assert budget.in_flight == 580_000 and budget.num_open == 1 and budget.refused == 1
            other.close()
            sock.sendall(head(len(body)) + body)  # the rest was read and dropped: reusable
            assert reply.readline() == b"HTTP/1.1 200 OK\r\n"
        wait_for(lambda: budget.in_flight == 0 and budget.num_open == 0)
        assert budget.refused == 1


def test_a_complete_body_without_room_to_decode_gets_503_and_frees_its_bytes():
    with served(**LIMITS) as handle:
        handle.server.body_wait_s = 0.3
        budget = handle.server.body_budget
        other = budget.open(580_000)
        assert other.grow_to(580_000, 1.0)  # done growing: any body can be read beside it
        status, retry_after, _ = post(handle.server.server_address_tuple(), padded_json(9000))
        assert (status, retry_after) == (503, "1")
        wait_for(lambda: budget.in_flight == 580_000 and budget.num_open == 1)
        other.close()


def send_and_close_mid_body(sock: socket.socket) -> None:
    sock.sendall(head(50_000) + padded_json(50_000)[:10_000])


def send_part_and_stall(sock: socket.socket) -> None:
    sock.sendall(head(50_000) + padded_json(50_000)[:10_000])
    assert status_line(sock).startswith(b"HTTP/1.1 408 ")


def send_bad_json(sock: socket.socket) -> None:
    body = b"{not json" + b" " * 20_000
    sock.sendall(head(len(body)) + body)
    assert status_line(sock).startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize("exit_path", [send_and_close_mid_body, send_part_and_stall,
                                       send_bad_json])
def test_reservations_are_released_on_every_exit_path(exit_path):
    with served(**LIMITS, request_timeout_s=1.0, min_body_rate=1000, idle_timeout_s=0.6) as handle:
        budget = handle.server.body_budget
        with socket.create_connection(handle.server.server_address_tuple(), timeout=30) as sock:
            exit_path(sock)
        wait_for(lambda: budget.in_flight == 0 and budget.num_open == 0)


# ---------------------------------------------------------------- the budget on its own


def total_is_safe(budget: BodyBudget, reservations: list[BodyReservation]) -> bool:
    """Whether every open reservation can still grow to its claim in some order."""
    free = budget.max_bytes - budget.in_flight
    left = sorted((r.claim - r.held, r.held) for r in reservations)
    for need, held in left:
        if need > free:
            return False
        free += held
    return True


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["open", "grow", "full", "close"]),
                          st.integers(0, 9), st.integers(0, 1500)), max_size=40))
def test_the_budget_never_overcommits_and_always_leaves_a_way_to_finish(steps):
    budget = BodyBudget(1000)
    reservations: list[BodyReservation] = []
    for action, pick, nbytes in steps:
        if action == "open" or not reservations:
            reservations.append(budget.open(nbytes))
            continue
        reservation = reservations[pick % len(reservations)]
        if action == "close":
            reservation.close()
            reservations.remove(reservation)
        else:
            held = reservation.held
            target = reservation.claim if action == "full" else held + nbytes
            if not reservation.grow_to(target, 0):
                assert reservation.held == held  # a refused growth keeps what it had
        assert 0 <= budget.in_flight <= budget.max_bytes
        assert budget.in_flight == sum(r.held for r in reservations)
        assert total_is_safe(budget, reservations)
    for reservation in reservations:
        reservation.close()
    assert budget.in_flight == 0 and budget.num_open == 0


def test_a_claim_is_capped_at_the_budget_and_a_closed_reservation_cannot_grow():
    budget = BodyBudget(1000)
    giant = budget.open(10**9)
    assert giant.claim == 1000 and giant.grow_to(10**9, 0) and budget.in_flight == 1000
    small = budget.open(1)
    assert not small.grow_to(1, 0.05) and budget.refused == 1
    giant.close()
    giant.close()  # twice: nothing more to give back
    assert small.grow_to(1, 0) and budget.in_flight == 1
    with pytest.raises(ValueError, match="closed"):
        giant.grow_to(1, 0)
    with pytest.raises(ValueError, match="max_bytes 0: expected an int >= 1"):
        BodyBudget(0)
