"""Serving failure paths: every waiting client gets an answer at once, nothing is left open."""

from __future__ import annotations

import threading

import pytest

from marl_runner import EnvRunner
from marl_runner.serving import codec
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
