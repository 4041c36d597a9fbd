"""The worker-process side of SubprocessVectorEnv (the protocol: `subprocess_protocol`).

While a worker is inside a sub-env's `step` or `reset` it keeps
`(env_id, monotonic start time)` in a shared `progress` array (`-1` when
idle), so that the parent can time each call out on its own and name the
sub-env that hung. A worker whose parent is gone exits quietly.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, MutableSequence, Sequence
from multiprocessing.connection import Connection
from typing import Any

from marl_runner.envs.base_env import EnvID, close_quietly
from marl_runner.envs.checks import EnvOutputCheck, check_reset_result, check_step_result
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentDict, MultiAgentEnv
from marl_runner.envs.owned_copies import owned_copy
from marl_runner.envs.reply_columns import ReplyColumns
from marl_runner.envs.shared_buffers import SlotBlock, layout_spec
from marl_runner.envs.shared_obs import SharedObsWriter
from marl_runner.envs.subprocess_checks import RequestChecks
from marl_runner.envs.subprocess_protocol import (
    DONE,
    STEP,
    Crash,
    Malformed,
    portable,
    send,
)

_TUPLES = {tuple}


class _SubEnvs:
    """The worker's sub-envs, their output checks and the progress it shows the parent."""

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        worker_index: int,
        check_spaces: bool,
        progress: MutableSequence[float] | None,
    ) -> None:
        self.make_one = make_one
        self.worker_index = worker_index
        self.check_spaces = check_spaces
        self.progress = progress if progress is not None else [-1.0, 0.0]
        self.envs: dict[EnvID, MultiAgentEnv] = {}
        self.checks: dict[EnvID, EnvOutputCheck] = {}
        self.request_checks = RequestChecks(self.checks, check_spaces, self.crash)

    def create(self, env_id: EnvID) -> None:
        env = self.make_one(env_id)
        self.envs[env_id] = env
        self.checks[env_id] = EnvOutputCheck(env, env_id, self.check_spaces)
        self.request_checks.forget()  # a new env: its key tuples are to be checked afresh

    def where(self, env_id: EnvID) -> str:
        return f"sub-env {env_id} (worker {self.worker_index})"

    def crash(self, error: BaseException, env_id: EnvID) -> Crash:
        return Crash(portable(error, self.where(env_id)))

    def reset(
        self,
        env_id: EnvID,
        seed: int | None,
        options: dict[str, Any] | None,
        obs_writer: SharedObsWriter,
    ) -> Any:
        env = self.envs[env_id]
        progress = self.progress
        progress[1] = time.monotonic()
        progress[0] = env_id
        try:
            obs, infos = check_reset_result(env.reset(seed=seed, options=options), env_id, env)
            self.checks[env_id].reset(obs)
        except EnvError as error:
            return Malformed(str(error))
        except BaseException as error:
            return Crash(portable(error, self.where(env_id)))
        finally:
            progress[0] = -1.0
        return obs_writer.pack(obs), infos

    def step_many(
        self,
        env_ids: Sequence[EnvID],
        actions: Sequence[MultiAgentDict],
        obs_writer: SharedObsWriter,
    ) -> tuple[list[Any], dict[EnvID, Any], float, ReplyColumns | None]:
        """Steps the listed sub-envs; resets those whose episode ended (unseeded,
        as the parent would) so their reset obs travel with this reply.

        Returns each sub-env's result (its step result as a tuple, a Crash or a
        Malformed), the resets, the time spent in the envs, and the results'
        columns when none ended or failed and all passed their checks together
        (the block writer reads those columns next; else None)."""
        results: list[Any] = []
        resets: dict[EnvID, Any] = {}
        apart: list[int] = []  # results that ended or failed: not checked with the others
        envs = self.envs
        progress = self.progress
        monotonic = time.monotonic
        start = time.perf_counter()  # env time: the loop (its own share is a small part)
        for env_id, env_actions in zip(env_ids, actions):
            env = envs[env_id]
            progress[1] = monotonic()
            progress[0] = env_id
            try:
                result = check_step_result(env.step(env_actions), env_id, env)
            except EnvError as error:
                result = Malformed(str(error))
            except BaseException as error:  # KeyboardInterrupt, SystemExit too: the env's doing
                result = self.crash(error, env_id)
            finally:
                progress[0] = -1.0
            if type(result) is not tuple:
                apart.append(len(results))
            elif result[2]["__all__"] or result[3]["__all__"]:
                apart.append(len(results))
                result = self.request_checks.check_one(env_id, result)  # before its reset
                if type(result) is tuple:
                    result = owned_copy(result)  # the reset may reuse the env's arrays
                    resets[env_id] = self.reset(env_id, None, None, obs_writer)
            results.append(result)
        env_s = time.perf_counter() - start
        if not apart:
            columns = ReplyColumns(results)
            passed = self.request_checks.check_many(env_ids, results, columns)
            return results, resets, env_s, columns if passed else None
        ended_or_failed = set(apart)
        together = [n for n in range(len(results)) if n not in ended_or_failed]
        if together:
            checked = [results[n] for n in together]
            self.request_checks.check_many([env_ids[n] for n in together], checked)
            for n, result in zip(together, checked):
                results[n] = result
        return results, resets, env_s, None


def pin_to_cpu(cpu: int) -> None:
    """Run this process on `cpu` only, as a batch (CPU-bound) task.

    With as many workers as CPUs, the kernel's wake-affine placement tends
    to queue a worker woken by a pipe write on the CPU of the process that
    wrote (the parent, or the other worker) while another CPU idles, until
    load balancing moves it; pinned workers cannot stack. `SCHED_BATCH`
    stops a woken worker from preempting the parent while it is still
    sending the other workers their actions. Best effort: where either is
    not available, the worker runs unpinned.
    """
    try:
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass


#: How often a worker looks whether the runner's process is still there.
_PARENT_POLL_S = 0.25


def _ignore_signal(signum: int, frame: object) -> None:
    """Left to the runner's process (see ``worker_main``)."""


def exit_with_parent(parent_pid: int) -> None:
    """Ends this process when the runner's process ``parent_pid`` is gone, whatever the
    worker is busy with (building a slow sub-env, say): a daemon thread polls it.

    Not ``prctl(PR_SET_PDEATHSIG)``: under forkserver a worker's parent is the fork
    server, which outlives the runner (every worker holds a copy of the fd whose closing
    would tell the server to exit).
    """

    def watch() -> None:
        while _alive(parent_pid):
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="marl-runner-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True  # no /proc: os.kill said it exists


def worker_main(
    conn: Connection,
    make_one: Callable[[int], MultiAgentEnv],
    env_ids: Sequence[EnvID],
    worker_index: int,
    cpu: int | None = None,
    block_prefix: str | None = None,
    progress: MutableSequence[float] | None = None,
    check_spaces: bool = False,
    parent_pid: int | None = None,
) -> None:
    """Serve step/reset/restart/render/close requests for `env_ids` until closed.

    Every request gets exactly one reply, so parent and worker never get out
    of step. Per sub-env replies are the env's result, a `Crash` or a
    `Malformed`. With `cpu`, the worker pins itself to that CPU first
    (`pin_to_cpu`). Shared-memory blocks are named `block_prefix` + a
    number, so the parent can free them if this worker is killed. When the
    parent is gone (its end of the pipe closed) the worker just exits; if it
    goes while the worker is busy (building a slow sub-env, say), the worker
    is ended all the same (``exit_with_parent``, given the runner's ``parent_pid``).
    """
    # Ctrl-C (sent to the whole process group), SIGTERM (a scheduler stopping the job's
    # processes) and SIGHUP (the terminal closed) are the parent's to handle: it stops the
    # run at the end of a round and then stops its workers; a worker whose parent is gone
    # exits (``exit_with_parent``).
    # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored in the
    # processes a sub-env starts (a simulator it stops with terminate()), a handler does not.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _ignore_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # blocked while it started
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    if cpu is not None:
        pin_to_cpu(cpu)
    sub_envs = _SubEnvs(make_one, worker_index, check_spaces, progress)
    for env_id in env_ids:
        try:
            sub_envs.create(env_id)
        except Exception as error:
            where = f"creating sub-env {env_id} (worker {worker_index})"
            _send_quietly(conn, Crash(portable(error, where)))
            return
    spec = layout_spec(sub_envs.envs[env_ids[0]], len(env_ids))
    slots = None
    if spec is not None:
        slots = SlotBlock.create(spec, None if block_prefix is None else f"{block_prefix}slots")
    obs_writer = SharedObsWriter(block_prefix)
    try:
        if _send_quietly(conn, ("ready", spec, slots and slots.name)):
            _serve(conn, sub_envs, obs_writer, slots, list(env_ids))
    finally:
        obs_writer.close()
        if slots is not None:
            slots.close(unlink=True)


def _step_reply(
    slots: SlotBlock | None,
    envs: list[int],
    results: list[Any],
    resets: dict[EnvID, Any],
    obs_writer: SharedObsWriter,
    columns: ReplyColumns | None,
) -> tuple | None:
    """Step results into the slots of sub-envs `envs` (local indices) where they fit
    (their entry becomes None); None when all did and nothing else needs saying, else
    the reply's `(new_block_name, results, resets, new_key_sets)` to pickle, each
    result not in the block a list (or its Crash or Malformed)."""
    new: list[tuple[int, tuple]] = []
    pickled = bool(resets)
    if slots is not None and columns is None and set(map(type, results)) == _TUPLES:
        columns = ReplyColumns(results)  # an episode ended: its reset goes pickled
    if slots is not None and columns is not None and slots.write_results(envs, results, columns):
        results = [None] * len(results)  # all in the block, written in one pass
    else:
        for n, (env, result) in enumerate(zip(envs, results)):
            if type(result) is not tuple:
                pickled = True
            elif slots is not None and slots.write_result(env, result, new):
                results[n] = None
            else:
                results[n] = [obs_writer.pack(result[0]), *result[1:]]
                pickled = True
    if not pickled and not new:
        return None
    return obs_writer.new_block_name(), results, resets, new


def _send_bytes_quietly(conn: Connection, data: bytes) -> bool:
    try:
        conn.send_bytes(data)
    except (OSError, EOFError):
        return False
    return True


def _send_quietly(conn: Connection, message: Any) -> bool:
    """Send `message`; False (no traceback) when the parent has gone away."""
    try:
        send(conn, message)
    except (OSError, EOFError):  # BrokenPipeError, ConnectionResetError
        return False
    return True


def _serve(
    conn: Connection,
    sub_envs: _SubEnvs,
    obs_writer: SharedObsWriter,
    slots: SlotBlock | None,
    env_ids: list[EnvID],
) -> None:
    """The worker's request loop (messages: see `subprocess_protocol`)."""
    clock = time.perf_counter
    envs = sub_envs.envs
    worker_index = sub_envs.worker_index
    local = {env_id: i for i, env_id in enumerate(env_ids)}
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died
        start = clock()
        if data == STEP:
            command, payload = "step", (None, ())
        else:
            command, payload = pickle.loads(data)
        if command == "step":
            request, new_sets = payload
            if slots is not None:
                for number, keys in new_sets:
                    slots.in_sets.learn(number, keys)
            if request is None:  # in the block: local indices, then the actions
                indices, actions = slots.read_actions()
                ids = list(map(env_ids.__getitem__, indices))
            else:
                ids = [env_id for env_id, _ in request]
                actions = [env_actions for _, env_actions in request]
                indices = list(map(local.__getitem__, ids))
            obs_writer.start_reply()
            results, resets, env_s, columns = sub_envs.step_many(ids, actions, obs_writer)
            reply = _step_reply(slots, indices, results, resets, obs_writer, columns)
            busy_s = clock() - start
            if reply is None:
                slots.layout.times[:] = (env_s, busy_s)
                sent = _send_bytes_quietly(conn, DONE)
            else:
                sent = _send_quietly(conn, (*reply, env_s, busy_s))
            # The round's objects (32 sub-envs of 8 agents: 256 obs arrays, their dicts and
            # rewards, the columns) are freed now, while the parent reads the reply, rather
            # than when the next request rebinds these names, with the parent waiting.
            del actions, results, resets, columns, reply
            if not sent:
                return
            continue
        elif command == "reset":
            obs_writer.start_reply()
            results = [
                sub_envs.reset(env_id, seed, options, obs_writer)
                for env_id, seed, options in payload
            ]
            reply = (obs_writer.new_block_name(), results)
        elif command == "restart":
            close_quietly(envs[payload], payload)
            try:
                sub_envs.create(payload)
                reply = None
            except Exception as error:
                reply = Crash(
                    portable(error, f"recreating sub-env {payload} (worker {worker_index})")
                )
        elif command == "render":
            try:
                reply = envs[payload].render()
            except Exception as error:
                reply = Crash(
                    portable(error, f"rendering sub-env {payload} (worker {worker_index})")
                )
        else:  # "close"
            for env_id, env in envs.items():
                close_quietly(env, env_id)
            _send_quietly(conn, None)
            return
        if not _send_quietly(conn, reply):
            return
