"""Serving failure paths: every waiting client gets an answer at once, nothing is left open."""

from __future__ import annotations

import http.client
import threading

import pytest

from marl_runner import EnvRunner
from marl_runner.serving import codec
from marl_runner.serving.server import PolicyServer
from marl_runner.serving.state_sync import StateSync
from tests.test_serving_http import serve_config, wait_for


def _waiting_exchanges(sync: StateSync, count: int) -> tuple[list[threading.Thread], list]:
    """`count` weight syncs queued in threads; each appends what it raised or returned."""
    results: list = []

    def exchange() -> None:
        try:
            results.append(sync.exchange({}, timeout_s=30))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=exchange, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(sync._pending) == count)
    return threads, results


@pytest.mark.parametrize("failing", ["get_state", "encode"])
def test_a_failing_snapshot_answers_every_waiting_weight_sync_at_once(monkeypatch, failing):
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    with EnvRunner(serve_config()) as runner:
        if failing == "get_state":
            monkeypatch.setattr(runner, "get_state", broken)
        else:
            monkeypatch.setattr(codec, "encode", broken)
        sync = StateSync()
        threads, results = _waiting_exchanges(sync, 2)
        with pytest.raises(OSError, match="disk gone"):
            sync.refresh(runner)  # the sampling loop still sees its own error
        for thread in threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in threads), "a client waits for its timeout"
        assert len(results) == 2 and all(type(r) is RuntimeError for r in results), results
        assert all("OSError: disk gone" in str(r) for r in results), results


@pytest.mark.parametrize("authorization", [None, "Bearer wrong"])
def test_a_stopping_server_reads_no_body_of_an_unauthorized_request(monkeypatch, authorization):
    with EnvRunner(serve_config()) as runner:
        # A long idle timeout: reading the body that never comes would outlast the client's wait.
        server = PolicyServer(runner, "127.0.0.1", 0, token="secret", idle_timeout_s=60).start()
        try:
            monkeypatch.setattr(server, "begin_request", lambda: False)  # as once close() began
            host, port = server.server_address_tuple()
            connection = http.client.HTTPConnection(host, port, timeout=10)
            connection.putrequest("POST", "/v1/experiences")
            connection.putheader("Content-Type", codec.JSON)
            connection.putheader("Content-Length", "1000")  # declared, never sent
            if authorization is not None:
                connection.putheader("Authorization", authorization)
            connection.endheaders()
            response = connection.getresponse()
            answer = codec.decode(response.read(), codec.JSON)
            connection.close()
        finally:
            server.close(timeout_s=0)
        assert (response.status, response.getheader("Connection")) == (503, "close")
        assert answer["type"] == "ExternalEnvStopped", answer
