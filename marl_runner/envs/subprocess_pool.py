"""SubprocessVectorEnv's worker processes: starting, pinning, handles, shutting down,
and where their time goes."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from time import monotonic
from typing import Any

from marl_runner.envs.base_env import EnvID
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentEnv
from marl_runner.envs.shared_buffers import SlotBlock
from marl_runner.envs.shared_obs import SharedObsReader, unlink_blocks
from marl_runner.envs.subprocess_protocol import receive, send
from marl_runner.envs.subprocess_worker import worker_main

# Never "fork": the parent usually holds torch threads, which a fork can deadlock.
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
SHUTDOWN_TIMEOUT_S = 5.0
_pools_made = itertools.count()


@dataclass
class InFlight:
    """A request whose reply is still to be read; one per worker at a time (the
    worker reuses its shared-memory block for the next reply)."""

    #: "start" (first resets), "step", "reset", "restart" or "render".
    kind: str
    #: step/start/reset: `[(env_id, ...), ...]`; restart/render: the env_id.
    request: Any
    sent_at: float


@dataclass
class SubprocessStats:
    """Where a SubprocessVectorEnv's time went, summed since creation (or the last
    `reset_stats`). Times in seconds; worker times summed over workers."""

    #: `poll` calls after the first.
    polls: int = 0
    #: Step requests sent (one per worker per poll in the default mode).
    step_requests: int = 0
    #: Sub-env steps whose results came back.
    env_steps: int = 0
    #: Of those, results that came pickled (not through the slot block): values that
    #: do not fit their slot, non-empty infos, failures (an episode's last step goes
    #: through the block; only its reset obs is pickled).
    pickled_env_steps: int = 0
    #: Step requests and replies pickled, not a byte with everything in the block.
    pickled_step_messages: int = 0
    #: Resets answered from the reset obs a worker sent with the episode's last step.
    prefetched_resets: int = 0
    #: Resets that needed their own round trip (the first reset, after crashes,
    #: explicit seed/options, restarts).
    reset_round_trips: int = 0
    #: Parent blocked waiting for replies (`recv` of step and reset replies, `wait`).
    parent_wait_s: float = 0.0
    #: Parent pickling requests and unpickling / copying out replies.
    parent_ipc_s: float = 0.0
    #: Workers inside their envs' `step`/`reset` during step requests.
    worker_env_s: float = 0.0
    #: Workers handling step requests, from reading one to sending its reply
    #: (minus `worker_env_s`: unpickling actions, packing obs, bookkeeping).
    worker_busy_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """Plain values for benchmark reports and JSON, without listing the fields."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class WorkerHandle:
    """The parent's handle on one worker process and the sub-envs it runs."""

    def __init__(
        self,
        index: int,
        env_ids: list[EnvID],
        process: BaseProcess,
        conn: Connection,
        block_prefix: str,
        progress: Any,
        cpu: int | None = None,
    ) -> None:
        self.index = index
        #: The CPU the worker is pinned to (None: not pinned).
        self.cpu = cpu
        self.env_ids = env_ids
        self.process = process
        self.conn = conn
        self.block_prefix = block_prefix
        #: `[env_id or -1, monotonic start]` of the env call the worker is in.
        self.progress = progress
        self.obs_reader = SharedObsReader()
        #: The per-step slot block (None: every step is pickled), set once ready.
        self.slots: SlotBlock | None = None
        #: env_id -> index among this worker's sub-envs (its slots).
        self.local = {env_id: i for i, env_id in enumerate(env_ids)}
        self.alive = True
        #: A close request was sent and its reply not yet waited for.
        self._closing = False
        self.in_flight: InFlight | None = None
        #: A reply read but not yet entered (an interruption came in between).
        self.unread: tuple[InFlight, bytes] | None = None
        #: The reply to the last restart/render request.
        self.reply: Any = None

    def describe(self) -> str:
        """Names the worker, its pid and sub-envs, so every error about it says the same."""
        return f"worker {self.index} (pid {self.process.pid}) running sub-envs {self.env_ids}"

    def kill(self) -> None:
        """End the process however it is, reap it, free its pipe and shared memory."""
        self.alive = False
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=SHUTDOWN_TIMEOUT_S)
        self.conn.close()
        self.obs_reader.detach()
        if self.slots is not None:
            self.slots.close()
            self.slots = None
        unlink_blocks(self.block_prefix)

    def ask_to_close(self) -> None:
        """Send the close request (``wait_closed`` then waits for it): all workers of a
        vector env are asked first, so their envs close side by side."""
        if not self.alive:
            return
        self.alive = False
        self._closing = True
        try:
            send(self.conn, ("close", None))
        except (OSError, EOFError):
            self._closing = False  # already gone

    def wait_closed(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic) for the worker to close its envs and exit;
        kill it then, however it is."""
        try:
            if self._closing:
                self._closing = False
                try:
                    # Replies come in request order: an unread reply precedes the close's.
                    for _ in range(2 if self.in_flight is not None else 1):
                        if not self.conn.poll(max(deadline - monotonic(), 0.0)):
                            break
                        self.conn.recv_bytes()
                except (OSError, EOFError):
                    pass  # gone meanwhile
                self.process.join(timeout=max(deadline - monotonic(), 0.1))
        finally:
            self.kill()


class WorkerLauncher:
    """Starts workers for one vector env: each with its sub-envs, its CPU and a
    fresh shared-memory name prefix (so a killed worker's blocks can be freed)."""

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_workers: int,
        pin_workers: bool,
        check_spaces: bool,
    ) -> None:
        self._make_one = make_one
        self._check_spaces = check_spaces
        self._context = mp.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            # Workers fork from a server that imported this package once,
            # instead of each importing numpy, pettingzoo (and torch) anew.
            self._context.set_forkserver_preload([worker_main.__module__])
        self._block_prefix = f"mr{os.getpid()}v{next(_pools_made)}"
        self._launches = itertools.count()
        #: The CPU each worker is pinned to (None: not pinned).
        self.cpus = worker_cpus(num_workers) if pin_workers else [None] * num_workers

    def launch(self, index: int, env_ids: list[EnvID]) -> WorkerHandle:
        """Starts worker `index`; a restart calls it again and gets a fresh block prefix."""
        parent_conn, child_conn = self._context.Pipe()
        block_prefix = f"{self._block_prefix}w{index}g{next(self._launches)}b"
        progress = self._context.RawArray("d", [-1.0, 0.0])
        process = self._context.Process(
            target=worker_main,
            args=(
                child_conn,
                self._make_one,
                env_ids,
                index,
                self.cpus[index],
                block_prefix,
                progress,
                self._check_spaces,
                os.getpid(),
            ),
            name=f"marl-runner-env-worker-{index}",
            daemon=True,
        )
        with _hang_up_blocked():
            process.start()
        child_conn.close()
        return WorkerHandle(
            index, env_ids, process, parent_conn, block_prefix, progress, self.cpus[index]
        )


@contextlib.contextmanager
def _hang_up_blocked() -> Iterator[None]:
    """SIGHUP blocked while a worker starts, and with it, the first time, multiprocessing's
    fork server and resource tracker: they inherit the mask. A closed terminal hangs up
    the whole process group; the run's own process then stops it (``GracefulStop``), while
    the tracker, had it died, would leave the workers' shared memory in /dev/shm. (A
    worker unblocks SIGHUP behind a handler that does nothing.)"""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def await_ready(worker: WorkerHandle) -> None:
    """Wait for the worker to have built its sub-envs; raise EnvError saying why not."""
    try:
        reply = receive(worker.conn)
    except (EOFError, OSError):
        worker.kill()
        raise EnvError(
            f"{worker.describe()} died (exit code {worker.process.exitcode}) before "
            "creating its sub-envs; see its stderr. A script that starts worker processes "
            "must guard its entry point with `if __name__ == '__main__':`, and cannot be "
            "read from stdin"
        ) from None
    if type(reply) is not tuple:
        raise EnvError(
            f"worker {worker.index} could not create its sub-envs {worker.env_ids}: {reply.error}"
        ) from reply.error
    _, spec, block_name = reply
    if spec is not None:
        worker.slots = SlotBlock.attach(spec, block_name)


def shut_down_all(workers: list[WorkerHandle]) -> None:
    """Every worker asked to close at once, then given until one shared deadline
    (``SHUTDOWN_TIMEOUT_S``): envs whose close hangs cost that once, not once per worker."""
    for worker in workers:
        try:
            worker.ask_to_close()
        except Exception:  # one worker's trouble must not leave the others running
            continue
    deadline = monotonic() + SHUTDOWN_TIMEOUT_S
    try:
        for worker in workers:
            try:
                worker.wait_closed(deadline)
            except Exception:
                continue
    except BaseException:
        # A Ctrl-C cuts the wait short, not the clean-up: the workers not waited for yet are
        # killed now. (Workers ignore SIGINT and SIGTERM, and the interpreter's exit would
        # join them with no timeout: forever, for an env whose close hangs.)
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.kill()
        raise


def worker_cpus(num_workers: int) -> list[int | None]:
    """The CPU to pin each worker to: distinct CPUs among those this process
    may use, when the workers (and this process) fill them; else None for all.

    Only then do workers contend for CPUs (the case pinning helps with). On
    a bigger machine, possibly shared by several runners, pinning every
    runner's workers to the same first CPUs would be harmful.
    """
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return [None] * num_workers
    if not max(num_workers, 2) <= len(allowed) <= num_workers + 1:
        return [None] * num_workers
    return allowed[:num_workers]
