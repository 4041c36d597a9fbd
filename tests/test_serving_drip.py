"""Clients dripping their request one byte at a time cannot hold the server.

A drip restarts any per-byte timeout, so only a deadline for the whole
request cuts it off; and while drippers wait to be cut off, a well-behaved
client, from the same address or another, is answered at once.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from marl_runner.client import PolicyClient
from tests.test_serving_http import serve_config, served

OBS = {f"a{i}": np.zeros(3, np.float32) for i in range(3)}
DRIP_EVERY_S = 0.2
IDLE_TIMEOUT_S = 1.0


@contextmanager
def drippers(address: str, count: int, sources: list[str]) -> Iterator[list[float]]:
    """`count` connections (from `sources`, in turn) sending a request head one byte every
    `DRIP_EVERY_S`; yields, per connection, the seconds after which the server cut it off
    (inf while it has not)."""
    host, port = address[len("http://"):].split(":")
    head = b"POST /v1/get_action HTTP/1.1\r\nHost: x\r\n" + b"X-Drip: " + b"y" * 4096
    cut_after = [float("inf")] * count
    stop = threading.Event()

    def drip(index: int) -> None:
        sock = socket.create_connection((host, int(port)), source_address=(sources[index % len(sources)], 0))
        began = time.monotonic()
        try:
            for byte in head:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                if stop.wait(DRIP_EVERY_S):
                    return
        except OSError:
            cut_after[index] = time.monotonic() - began
        finally:
            sock.close()

    threads = [threading.Thread(target=drip, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)  # every dripper connected and sending
        yield cut_after
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)


def play_while_dripped(address: str, seconds: float) -> list[float]:
    """Latencies of a well-behaved client's calls for `seconds` (any error fails the test)."""
    latencies = []
    with PolicyClient(address, timeout_s=5, retries=0) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.monotonic()
            eid = client.start_episode()
            client.get_action(eid, OBS)
            client.log_returns(eid, dict.fromkeys(OBS, 1.0))
            client.end_episode(eid, OBS)
            latencies.append(time.monotonic() - began)
    return latencies


def test_drippers_from_the_clients_own_address_neither_lock_it_out_nor_stay_connected():
    with served(serve_config(num_envs=2), idle_timeout_s=IDLE_TIMEOUT_S) as handle:
        with drippers(handle.server.address, 80, ["127.0.0.1"]) as cut_after:
            latencies = play_while_dripped(handle.server.address, 2.5)
            assert len(latencies) >= 10 and max(latencies) < 1.0, latencies
            # Cut off by the deadline of the whole head, though a byte came every 0.2 s.
            assert max(cut_after) < IDLE_TIMEOUT_S + 1.5, sorted(cut_after)[-5:]


def test_drippers_spread_over_addresses_do_not_starve_a_well_behaved_client():
    sources = [f"127.0.0.{i}" for i in range(2, 82)]
    with served(serve_config(num_envs=2), idle_timeout_s=IDLE_TIMEOUT_S) as handle:
        with drippers(handle.server.address, 80, sources) as cut_after:
            latencies = play_while_dripped(handle.server.address, 2.5)
            assert len(latencies) >= 10 and max(latencies) < 1.0, latencies
            assert max(cut_after) < IDLE_TIMEOUT_S + 1.5, sorted(cut_after)[-5:]
