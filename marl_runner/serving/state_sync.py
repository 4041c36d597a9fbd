"""Weights and connector state for local-inference clients, made in the runner's thread.

Their filter statistics are merged into the server's filters exactly, and
neither may touch the policies while the sampling loop uses them: requests
queue here and the loop serves them between two steps (`refresh`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from marl_runner.distributed.filter_states import (
    install_filter_states,
    merge_filter_states,
    read_filter_states,
)
from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.serving import codec
from marl_runner.serving.validation import RequestError


class StateSync:
    """Filter deltas in, encoded weights and connector state out, in the runner's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[dict, Future]] = []
        self._stopped: ExternalEnvStopped | None = None

    def exchange(self, deltas: dict, timeout_s: float = 30.0) -> bytes:
        """Queues a client's filter deltas; returns the encoded state with them merged in."""
        answer: Future = Future()
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._pending.append((deltas, answer))
        try:
            return answer.result(timeout_s)
        except TimeoutError:
            raise TimeoutError("the runner did not publish its weights in time") from None

    def refresh(self, runner: Any) -> None:
        """Merges the queued deltas and publishes one state snapshot; the sampling loop calls it."""
        with self._lock:
            requests, self._pending = self._pending, []
        if not requests:
            return
        for deltas, answer in requests:
            if deltas:
                try:
                    install_filter_states(runner, merge_filter_states(read_filter_states(runner),
                                                                      [deltas]))
                except Exception as exc:
                    answer.set_exception(RequestError(
                        f"filter_deltas do not fit the server's filters: {exc}"))
        try:
            body = codec.encode(runner.get_state())
        except Exception as exc:
            # Taken off the queue, these clients wait on nobody else: answer them now (500).
            _settle(requests, error=RuntimeError(
                f"the server could not snapshot its weights: {type(exc).__name__}: {exc}"))
            raise
        _settle(requests, body=body)

    def stop(self, reason: str) -> None:
        """Fails the queued and later exchanges: no sampling loop will answer them any more."""
        with self._lock:
            self._stopped = ExternalEnvStopped(reason)
            requests, self._pending = self._pending, []
        _settle(requests, error=self._stopped)


def _settle(requests: list[tuple[dict, Future]], body: bytes | None = None,
            error: BaseException | None = None) -> None:
    """Hands `body`, or `error`, to the requests not answered yet."""
    for _, answer in requests:
        if not answer.done():
            if error is None:
                answer.set_result(body)
            else:
                answer.set_exception(error)
