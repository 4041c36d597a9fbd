"""`marl-runner serve --workers N`: local inference served by N processes on one port.

A local-inference client keeps no episode on the server, so N - 1 workers on
the same port (`SO_REUSEPORT`) decode and check uploads; over a pipe each, the
main process does what must happen once: queue an upload for the one writer of
`--out` (answered 200 only then), merge a weight sync. Remote inference keeps
episode state in one runner: with N > 1 every process refuses it (501).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

READY_TIMEOUT_S = 120.0


class Upstream:
    """A worker's calls into the main process, one at a time over its pipe."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def call(self, kind: str, payload: Any) -> Any:
        """Runs `kind` ("experiences" or "state") in the main process; raises what it raised."""
        with self._lock:
            self._conn.send((kind, payload))
            result = self._conn.recv()
        if isinstance(result, BaseException):
            raise result
        return result


def answer_worker(server: Any, conn: Connection) -> None:
    """The main process's side of one worker's pipe, until the worker exits."""
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if kind == "experiences":
                result: Any = server.accept_upload(payload)
            else:
                result = server.state_sync.exchange(payload)
        except Exception as exc:
            result = exc
        conn.send(result)


def start_workers(count: int, server: Any, config: dict, token: str | None,
                  settings: dict) -> list[multiprocessing.Process]:
    """`count` worker processes serving `server`'s port, each answered by a thread here."""
    context = multiprocessing.get_context("spawn")
    host, port = server.server_address_tuple()
    workers = []
    for index in range(count):
        here, there = context.Pipe()
        process = context.Process(
            target=_worker_main, args=(config, host, port, token, settings, there),
            name=f"marl-runner-serve-worker-{index}", daemon=True,
        )
        process.start()
        workers.append(process)
        if not here.poll(READY_TIMEOUT_S) or here.recv() != "ready":
            stop_workers(workers)
            raise RuntimeError(f"serve worker {index} did not start within {READY_TIMEOUT_S} s")
        threading.Thread(target=answer_worker, args=(server, here), daemon=True).start()
    return workers


def stop_workers(workers: list[multiprocessing.Process], timeout_s: float = 30.0) -> None:
    """Each worker closes as `PolicyServer.close()` does (answered uploads queued here first)."""
    for process in workers:
        if process.is_alive():
            process.terminate()  # SIGTERM: the worker's graceful close
    for process in workers:
        process.join(timeout_s)
        if process.is_alive():
            process.kill()


def _worker_main(config: dict, host: str, port: int, token: str | None, settings: dict,
                 conn: Connection) -> None:
    from marl_runner.config.runner_config import RunnerConfig
    from marl_runner.sampling.runner import EnvRunner
    from marl_runner.serving.server import PolicyServer, listening_socket

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the main decides
    with EnvRunner(RunnerConfig.from_dict(config)) as runner:
        server = PolicyServer(
            runner, host, port, token=token, sock=listening_socket(host, port, reuse_port=True),
            local_only=True, upstream=Upstream(conn), **settings,
        ).start()
        conn.send("ready")
        stop.wait()
        server.close()
