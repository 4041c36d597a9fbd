"""`PolicyServer.close()` loses no request it answered 200.

An upload is held inside its handler (the batch check waits on an event)
while `close()` runs: either `close()` waits for it, and `drain_uploads()`
right after `close()` hands over its rows (the client got 200), or it
outlived the wait and the client got 503 with nothing queued. Never 200 and
lost. Requests arriving once `close()` began get 503 and `Connection: close`.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from marl_runner import EnvRunner, MultiAgentBatch
from marl_runner.serving import codec
from marl_runner.serving import server as server_module
from marl_runner.serving.server import PolicyServer
from tests.test_serving_hostile import upload
from tests.test_serving_http import serve_config, wait_for


class HeldUpload:
    """Holds every upload inside its handler, in the batch check, until `release` is set."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, value: Any, policy_map: dict) -> Any:
        self.entered.set()
        assert self.release.wait(30), "the test never released the upload"
        return self.real(value, policy_map)


@contextmanager
def policy_server() -> Iterator[PolicyServer]:
    """A started server with no sampling loop: the test drains the uploads itself."""
    with EnvRunner(serve_config()) as runner:
        server = PolicyServer(runner, "127.0.0.1", 0).start()
        try:
            yield server
        finally:
            server.close(timeout_s=0)


def connect(server: PolicyServer) -> http.client.HTTPConnection:
    host, port = server.server_address_tuple()
    return http.client.HTTPConnection(host, port, timeout=30)


def post_upload(connection: http.client.HTTPConnection, answers: list) -> None:
    """One upload of 4 rows; appends (status, Connection header, decoded answer)."""
    connection.request("POST", "/v1/experiences", codec.encode(upload()),
                       {"Content-Type": codec.BINARY})
    response = connection.getresponse()
    answer = codec.decode(response.read(), response.getheader("Content-Type"))
    answers.append((response.status, response.getheader("Connection"), answer))


def start_upload(server: PolicyServer, answers: list) -> threading.Thread:
    thread = threading.Thread(target=post_upload, args=(connect(server), answers), daemon=True)
    thread.start()
    return thread


def close_then_drain(server: PolicyServer, drained: list, **close_kwargs: Any) -> threading.Thread:
    """As `serve` stops: `close()`, then at once `drain_uploads()`."""

    def run() -> None:
        server.close(**close_kwargs)
        server.drain_uploads(drained.append)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def held(monkeypatch) -> Iterator[HeldUpload]:
    hold = HeldUpload(server_module.batch_from_value)
    monkeypatch.setattr(server_module, "batch_from_value", hold)
    yield hold
    hold.release.set()


def test_an_upload_in_progress_when_close_begins_is_answered_200_and_drained(held):
    with policy_server() as server:
        answers: list = []
        client = start_upload(server, answers)
        assert held.entered.wait(30)
        drained: list = []
        closer = close_then_drain(server, drained)
        # close() must still be waiting: the upload was neither answered nor queued.
        closer.join(0.5)
        assert closer.is_alive() and not drained and not answers
        held.release.set()
        closer.join(30)
        client.join(30)
        assert not closer.is_alive() and not client.is_alive()
        assert answers[0][0] == 200, answers
        assert len(drained) == 1 and isinstance(drained[0], MultiAgentBatch)
        assert drained[0].policy_batches["p"]["t"].tolist() == [0, 1, 2, 3]


def test_an_upload_outliving_the_close_wait_gets_503_and_is_not_queued(held):
    with policy_server() as server:
        answers: list = []
        client = start_upload(server, answers)
        assert held.entered.wait(30)
        drained: list = []
        closer = close_then_drain(server, drained, timeout_s=0.1)
        closer.join(30)
        assert not closer.is_alive() and not drained  # close() gave up waiting
        held.release.set()  # the upload's check ends after the drain
        client.join(30)
        assert not client.is_alive()
        status, _, answer = answers[0]
        assert status == 503 and answer["type"] == "ExternalEnvStopped", answers
        server.drain_uploads(drained.append)
        assert not drained


def test_a_request_on_an_open_connection_after_close_began_gets_503_and_connection_close(held):
    with policy_server() as server:
        kept_alive = connect(server)
        kept_alive.request("GET", "/v1/health")
        first = kept_alive.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("Connection") != "close"
        answers: list = []
        client = start_upload(server, answers)  # keeps close() waiting
        assert held.entered.wait(30)
        drained: list = []
        closer = close_then_drain(server, drained)
        wait_for(lambda: server.closing)
        late: list = []
        post_upload(kept_alive, late)  # on the connection opened before close()
        status, connection, answer = late[0]
        assert (status, connection) == (503, "close"), late
        assert answer["type"] == "ExternalEnvStopped" and "stopping" in answer["error"]
        held.release.set()
        closer.join(30)
        client.join(30)
        assert answers[0][0] == 200 and len(drained) == 1  # only the upload answered 200
        kept_alive.close()


def test_close_fails_a_waiting_weight_sync_with_503_at_once():
    with policy_server() as server:
        result: list = []

        def sync() -> None:
            try:
                server.state_sync.exchange({}, timeout_s=30)
            except Exception as exc:
                result.append(exc)

        thread = threading.Thread(target=sync, daemon=True)
        thread.start()
        wait_for(lambda: server.state_sync._pending)  # queued; no sampling loop answers it
        server.close()
        thread.join(5)
        assert not thread.is_alive()
        assert type(result[0]).__name__ == "ExternalEnvStopped", result


def test_close_without_start_returns():
    with EnvRunner(serve_config()) as runner:
        PolicyServer(runner, "127.0.0.1", 0).close()


def test_uploads_answered_before_close_are_all_drained():
    with policy_server() as server:
        connection = connect(server)
        answers: list = []
        for _ in range(3):
            post_upload(connection, answers)
        connection.close()
        drained: list = []
        server.close()
        server.drain_uploads(drained.append)
    assert [a[0] for a in answers] == [200] * 3 and len(drained) == 3
    assert all(np.array_equal(b.policy_batches["p"]["t"], np.arange(4)) for b in drained)
