"""Slow clients (slowloris) cannot hold the policy server: a body must arrive within a
deadline for the whole of it (a head start plus a minimum rate), not within a timeout per
byte; meanwhile other clients are served. Header drippers: tests/test_serving_drip.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from marl_runner.serving import codec
from marl_runner.serving.http_app import MAX_LINE_BYTES, HttpSettings
from tests.test_serving_http import served

LIMITS = {"idle_timeout_s": 5.0, "request_timeout_s": 0.5, "min_body_rate": 1000.0}


def trickle(address: tuple[str, int], length: int, every_s: float, stop: threading.Event) -> dict:
    """A POST declaring `length` bytes, sent one byte every `every_s` until the server closes;
    returns what came back and after how long its first byte came."""
    result: dict = {"answer": b"", "after_s": None}
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(f"POST /v1/log_returns HTTP/1.1\r\nHost: x\r\nContent-Type: {codec.JSON}\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())
    began = time.monotonic()
    sock.settimeout(every_s)
    try:
        while not stop.is_set():
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                sock.sendall(b" ")
                continue
            if result["after_s"] is None:
                result["after_s"] = time.monotonic() - began
            result["answer"] += chunk
            if not chunk:
                break
    except OSError:
        pass
    sock.close()
    return result


def health(address: tuple[str, int]) -> float:
    """Seconds a plain GET /v1/health took (it must succeed)."""
    began = time.monotonic()
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("GET", "/v1/health")
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["ok"] is True
    finally:
        connection.close()
    return time.monotonic() - began


def test_body_drippers_are_cut_off_by_the_whole_body_deadline_while_others_are_served():
    with served(**LIMITS) as handle:
        address = handle.server.server_address_tuple()
        stop = threading.Event()
        results: list[dict] = []
        threads = [threading.Thread(target=lambda: results.append(trickle(address, 1000, 0.05,
                                                                          stop)))
                   for _ in range(20)]
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        assert max(health(address) for _ in range(5)) < 0.5
        for thread in threads:
            thread.join(10)
        stop.set()
    # 1000 bytes at 1000 bytes/s after a 0.5 s head start: 1.5 s, whatever the drip.
    assert len(results) == 20
    for result in results:
        assert result["answer"].startswith(b"HTTP/1.1 408 "), result
        assert 1.4 < result["after_s"] < 3.0, result
    assert handle.server.requests_timed_out == 20


def test_a_body_slower_than_the_head_start_but_above_the_minimum_rate_is_accepted():
    with served(**LIMITS) as handle:
        address = handle.server.server_address_tuple()
        body = json.dumps({"episode_id": "x", "rewards": {}, "pad": " " * 1500}).encode()
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(f"POST /v1/log_returns HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         f"{codec.JSON}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            for start in range(0, len(body), 400):  # ~1,300 bytes/s: about 1.2 s in all
                sock.sendall(body[start:start + 400])
                time.sleep(0.3)
            answer = sock.recv(4096)
    # Past the head start, within the rate: read whole, then refused for its content.
    assert answer.startswith(b"HTTP/1.1 400 ") and b"unknown episode" in answer, answer


def test_each_request_on_a_kept_alive_connection_gets_its_own_deadline():
    with served(**LIMITS) as handle:
        connection = http.client.HTTPConnection(*handle.server.server_address_tuple(), timeout=5)
        for _ in range(3):
            time.sleep(0.3)  # idle between requests: only the idle timeout applies
            connection.request("GET", "/v1/health")
            response = connection.getresponse()
            assert response.status == 200 and response.getheader("Connection") != "close"
            response.read()
        connection.close()


def test_a_head_line_over_the_limit_gets_a_4xx_and_one_under_it_is_served():
    with served() as handle:
        address = handle.server.server_address_tuple()
        for size, status in ((MAX_LINE_BYTES - 100, b"200"), (MAX_LINE_BYTES + 100, b"400")):
            with socket.create_connection(address, timeout=5) as sock:
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * size
                             + b"\r\n\r\n")
                assert sock.recv(4096)[9:12] == status


@pytest.mark.parametrize(("setting", "value"), [
    ("idle_timeout_s", 0), ("request_timeout_s", -1.0), ("min_body_rate", float("inf")),
    ("max_concurrency", 0), ("backlog", True), ("max_body_bytes", 1.5),
])
def test_bad_settings_are_refused_naming_the_value(setting, value):
    kwargs = {"max_body_bytes": 10, "max_concurrency": 1, setting: value}
    with pytest.raises(ValueError, match=rf"{setting} {value!r}: expected"):
        HttpSettings(**kwargs)
