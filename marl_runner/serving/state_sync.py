"""Weights and connector state handed to local-inference clients, made in the runner's thread.

A client that runs the policies itself needs the server's weights and
connector state, and its observation filters' statistics must flow back into
the server's filters. Neither may touch the policies while the sampling loop
uses them, so requests queue here and the loop serves them between two steps.
"""

from __future__ import annotations

import threading
from typing import Any

from marl_runner.distributed.filter_states import (
    install_filter_states,
    merge_filter_states,
    read_filter_states,
)
from marl_runner.envs.external_episodes import ExternalEnvStopped
from marl_runner.serving import codec
from marl_runner.serving.validation import RequestError


class _SyncRequest:
    __slots__ = ("deltas", "body", "error")

    def __init__(self, deltas: dict) -> None:
        self.deltas = deltas
        self.body: bytes | None = None
        self.error: BaseException | None = None


class StateSync:
    """Weights and connector state for local-inference clients, exchanged in the runner's thread.

    A client sends what its observation filters saw since its last sync
    (their deltas) and gets back the server's weights and connector state,
    with those deltas merged in exactly (as `EnvRunnerGroup` does for its
    runners). The sampling loop does the merge and the snapshot between two
    steps (`refresh`), so nobody touches the policies while the runner uses them.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._pending: list[_SyncRequest] = []
        self._stopped: ExternalEnvStopped | None = None

    def exchange(self, deltas: dict, timeout_s: float = 30.0) -> bytes:
        """Queues a client's filter deltas; returns the encoded state with them merged in.

        The request thread waits here while the sampling loop does the work in `refresh`.
        """
        request = _SyncRequest(deltas)
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._pending.append(request)
            done = self._lock.wait_for(lambda: request.body is not None or request.error, timeout_s)
        if request.error is not None:
            raise request.error
        if not done:
            raise TimeoutError("the runner did not publish its weights in time")
        assert request.body is not None
        return request.body

    def refresh(self, runner: Any) -> None:
        """Merges the queued deltas and publishes one state snapshot; the sampling loop calls it."""
        with self._lock:
            if not self._pending:
                return
            requests, self._pending = self._pending, []
        for request in requests:
            if request.deltas:
                try:
                    merged = merge_filter_states(read_filter_states(runner), [request.deltas])
                    install_filter_states(runner, merged)
                except Exception as exc:
                    request.error = RequestError(
                        f"filter_deltas do not fit the server's filters: {exc}"
                    )
        try:
            body = codec.encode(runner.get_state())
        except Exception as exc:
            # Taken off the queue, these clients wait on nobody else: answer them now (500).
            failure = RuntimeError(
                f"the server could not snapshot its weights: {type(exc).__name__}: {exc}"
            )
            self._answer(requests, error=failure)
            raise
        self._answer(requests, body=body)

    def _answer(
        self,
        requests: list[_SyncRequest],
        body: bytes | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Hands `body`, or `error` to those without one yet, to `requests`; wakes their threads."""
        with self._lock:
            for request in requests:
                request.body = body
                if error is not None and request.error is None:
                    request.error = error
            self._lock.notify_all()

    def stop(self, reason: str) -> None:
        """Fails the queued and later exchanges: no sampling loop will answer them any more."""
        with self._lock:
            self._stopped = ExternalEnvStopped(reason)
            for request in self._pending:
                request.error = self._stopped
            self._pending = []
            self._lock.notify_all()
