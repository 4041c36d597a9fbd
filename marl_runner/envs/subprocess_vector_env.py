"""N sub-envs in worker processes on this machine, stepped in parallel."""

from __future__ import annotations

import os
import pickle
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait
from time import monotonic, perf_counter
from typing import Any

import gymnasium as gym

from marl_runner.envs.base_env import (
    BaseEnv,
    EnvID,
    PollDicts,
    ResetSeeds,
    close_within,
)
from marl_runner.envs.errors import EnvError, SubEnvGoneError
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv
from marl_runner.envs.step_block import materialize
from marl_runner.envs.subprocess_cpu import current_cpu
from marl_runner.envs.subprocess_pool import (
    SHUTDOWN_TIMEOUT_S,
    InFlight,
    SubprocessStats,
    WorkerHandle,
    WorkerLauncher,
    await_ready,
    shut_down_all,
)
from marl_runner.envs.subprocess_protocol import DONE, STEP, Crash, send
from marl_runner.envs.subprocess_replies import Replies
from marl_runner.envs.subprocess_restarts import RestartBook, lost_worker_error, timeout_reason


class SubprocessVectorEnv(BaseEnv):
    """Sub-envs spread over worker processes, several per worker.

    Default (synchronous) protocol: `send_actions` sends every worker the
    actions of its sub-envs at once, so workers step in parallel while the
    caller finishes its round (a runner builds its fragments meanwhile);
    `poll` waits for every reply, reading each as it comes (the first
    worker's results are copied out while the others still step), and hands
    them out in the order the actions were sent. Results equal
    SyncVectorEnv's for the same seed (same seeding rule, same order), and
    so do a runner's batches.

    Async pools (`num_envs_per_poll` < `num_envs`, as EnvPool's and
    PufferLib's batch size): `poll` returns as soon as the results of
    at least `num_envs_per_poll` sub-envs are in (or every sub-env still
    stepping has answered), with every result ready by then, so workers step
    while the caller works on the others' results and a slow sub-env never
    stalls the sub-envs of other workers (one worker per sub-env,
    `num_workers=num_envs`, isolates each). Each sub-env still appears in
    exactly one poll per action dict it was sent, and every sub-env is
    seeded as under SyncVectorEnv; but which sub-envs share a poll depends
    on timing, so a runner's batches (the grouping of rows into rounds,
    episode ids, fragment boundaries) are not reproducible run to run and
    differ from `sync`'s. Every batch invariant holds. `async_poll=True` is
    the same as `num_envs_per_poll=1`.

    Resets: a worker resets a sub-env right after the step that ended its
    episode (`"__all__"` terminated or truncated), unseeded as SyncVectorEnv
    would, and sends the reset obs with that step's results; `try_reset`
    then answers from them without a round trip (its failures reported as
    for any reset). `try_reset` with a `seed`, `options`, or on a recreated
    sub-env (whose first reset is seeded) discards that reset and resets
    again: for an unseeded reset with `options` the env's RNG then differs
    from SyncVectorEnv's. Rendering after an episode's last step shows the
    new episode.

    Steps go through a preallocated shared-memory block per worker (see
    `shared_buffers`): actions, obs, rewards and flags in per-(sub-env,
    agent) slots laid out from `possible_agents` and each agent's spaces,
    one byte on the pipe each way. What does not fit its slot (spawned
    agents, other shapes or dtypes, non-empty infos), failures and the
    resets sent with episode ends travel pickled (obs dicts of equal-shaped
    arrays then through a second block, see `shared_obs`). Results are
    copied out when the reply is read, before the worker's next request:
    obs arrays handed out are the caller's to keep. When every sub-env of a
    message has the same agents as last round, the whole message goes
    through the block in one pass (`shared_bulk`); flag dicts that are all
    False and info dicts of empty infos may then be one dict shared between
    sub-envs and rounds, read-only (as an env's own may be). When, besides,
    every sub-env of a reply is observed and rewarded by the same agents and
    sets no flag, `poll_blocks` hands the reply over as one `StepBlock`
    (obs `[sub-envs, agents, ...]` and rewards copied out of the block), so
    a runner skips the dicts; `poll` makes it the same dicts as ever.

    A sub-env exception becomes that sub-env's Exception entry, with the
    worker's traceback in its `__notes__`. A worker that dies (`os._exit`,
    SIGKILL from outside) turns each of its sub-envs stepped that round into
    an `EnvError` entry naming worker and sub-envs. Resetting a dead
    worker's sub-env recreates the worker when `restart_failed` (or after
    `try_restart`), else fails: `try_reset` returns an `EnvError` as the obs.

    Hangs: with `step_timeout_s`, a sub-env whose `step` or `reset` runs
    longer than that gets a `SubEnvTimeoutError` entry and its worker is
    killed (nothing else can stop a hung call). The other sub-envs of that
    worker lose their episodes with it: those stepped in the same request
    get an `EnvError` entry saying why, and a sub-env of a recreated worker
    that is stepped before it was reset fails the same way. Their episodes
    are dropped and counted as faulty, never continued on a fresh env or
    lost without a word; one worker per sub-env (`num_workers=num_envs`)
    confines a hang to its own sub-env.

    Bad output (see `checks`: malformed dicts, undeclared agents,
    non-finite rewards, with `check_env_outputs` obs outside their space) is
    checked in the worker and is an `EnvError` naming sub-env, agent and
    field: that sub-env's entry with `restart_failed`; otherwise `poll` (or
    `try_reset`) raises it once every reply of the round is read, and the
    next `poll` returns the others' results with the bad sub-env's entry.

    Interruptions (KeyboardInterrupt) and other exceptions out of `poll`,
    `send_actions` or `try_reset` never leave a reply unread for a later
    call: sent requests stay in flight and a retried call collects them,
    results already read are kept for the next `poll`, and a worker whose
    pipe may hold half a message is killed (its sub-envs fail as above).
    Shared-memory blocks are named per worker, so a killed worker's blocks
    are freed too.

    `stats` (a `SubprocessStats`) tells where the time goes: waiting, IPC,
    env steps in the workers.

    Args:
        make_one: builds sub-env `index`; pickled to the workers (use
            `marl_runner.envs.registry.EnvFactory` or a module-level function).
        num_envs: number of sub-envs.
        seed: as for SyncVectorEnv.
        restart_failed: recreate crashed sub-envs (and dead workers) before
            their next reset.
        num_workers: processes to use; default `min(num_envs, os.cpu_count())`.
        num_envs_per_poll: the fewest sub-envs a `poll` waits for (async pools, see
            above); default `num_envs`: the synchronous protocol.
        async_poll: short for `num_envs_per_poll=1`.
        check_env_outputs: also check every obs against its agent's space.
        step_timeout_s: seconds a sub-env's `step` or `reset` may take
            (None: wait forever; a Ctrl-C still stops the wait).
        pin_workers: when the workers and this process fill the CPUs this
            process may use (`num_workers` or `num_workers + 1` of them, at
            least 2), pin worker i to the i-th of them and make it a
            `SCHED_BATCH` task (see `subprocess_worker.pin_to_cpu`); this
            process stays unpinned. With 2 workers on 2 otherwise idle CPUs
            that is worth 8-15% of throughput on env-bound workloads (KAZ:
            1.38x -> 1.56x over sync; simple_spread 1.13x -> 1.22x). On CPUs
            that other processes keep busy it costs more than that (KAZ, 2
            CPUs at load ~2.5: 0.58x of the sync bare loop pinned, 0.85x
            not), since a pinned worker cannot leave a busy CPU: pass False
            there. Linux only; elsewhere, or with more CPUs, a no-op.
    """

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_envs: int,
        seed: int | None = None,
        restart_failed: bool = False,
        num_workers: int | None = None,
        async_poll: bool = False,
        num_envs_per_poll: int | None = None,
        pin_workers: bool = True,
        check_env_outputs: bool = False,
        step_timeout_s: float | None = None,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise EnvError(f"num_envs {num_envs!r}: expected an int >= 1")
        if num_workers is None:
            num_workers = min(num_envs, os.cpu_count() or 1)
        if not isinstance(num_workers, int) or not 1 <= num_workers <= num_envs:
            raise EnvError(
                f"num_workers {num_workers!r}: expected an int in [1, num_envs={num_envs}]"
            )
        if step_timeout_s is not None and not step_timeout_s > 0:
            raise EnvError(f"step_timeout_s {step_timeout_s!r}: expected a number > 0 or None")
        try:
            pickle.dumps(make_one)
        except Exception as error:
            raise EnvError(
                f"the env creator {make_one!r} cannot be pickled for worker processes ({error}); "
                "use a 'module:callable' env name or register a module-level function"
            ) from error
        self.num_envs = num_envs
        self.num_envs_per_poll = _envs_per_poll(num_envs_per_poll, async_poll, num_envs)
        #: Whether the async-pool protocol is on (`num_envs_per_poll` < `num_envs`).
        self.async_poll = self.num_envs_per_poll < num_envs
        self.step_timeout_s = step_timeout_s
        self.stats = SubprocessStats()
        self._make_one = make_one
        self._seeds = ResetSeeds(seed, num_envs)
        self._check_spaces = bool(check_env_outputs)
        self._launcher = WorkerLauncher(make_one, num_workers, pin_workers, self._check_spaces)
        env_blocks = [
            list(range(num_envs * w // num_workers, num_envs * (w + 1) // num_workers))
            for w in range(num_workers)
        ]
        self._worker_of_env = [w for w, block in enumerate(env_blocks) for _ in block]
        #: Whether workers are pinned to CPUs (then the send order matters, see send_actions).
        self._pinned = any(cpu is not None for cpu in self._launcher.cpus)
        self._workers: list[WorkerHandle] = []
        self._finalizer = weakref.finalize(self, shut_down_all, self._workers)
        try:
            for w, block in enumerate(env_blocks):
                self._workers.append(self._launcher.launch(w, block))
            for worker in self._workers:
                await_ready(worker)
        except BaseException:
            self._finalizer()
            raise
        self._restarts = RestartBook(restart_failed, self._seeds)
        #: Sub-envs sent actions since the last poll, in order (the synchronous protocol).
        self._round_order: dict[EnvID, None] = {}
        self._replies = Replies(self._restarts)
        #: Workers whose sub-envs' first resets are still to be asked for.
        self._to_start = list(self._workers)
        self._probe_env: MultiAgentEnv | None = None

    def reset_stats(self) -> SubprocessStats:
        """The stats so far; starts counting afresh."""
        stats, self.stats = self.stats, SubprocessStats()
        return stats

    def poll(self) -> PollDicts:
        return materialize(self.poll_blocks())

    def poll_blocks(self) -> PollDicts:
        """`poll`, with the sub-envs of a reply that all look alike (same agents, no
        flag set, no infos, one array obs space) as `BlockRow`s of one `StepBlock`; in a
        reply that also carries resets or other pickled parts, those of its sub-envs
        that lie in the block and go on, where they look alike."""
        if self._to_start:
            while self._to_start:
                worker = self._to_start[0]
                request = [
                    (env_id, self._seeds.for_reset(env_id), None) for env_id in worker.env_ids
                ]
                del self._to_start[0]
                self._send(worker, "start", request)
            self._collect_replies(None)
            return self._replies.take(range(self.num_envs))
        self.stats.polls += 1
        if self.async_poll:
            self._collect_replies(self.num_envs_per_poll)
            return self._replies.take()
        self._collect_replies(None)
        order, self._round_order = self._round_order, {}
        return self._replies.take(order)

    def send_actions(self, actions: dict[EnvID, MultiAgentDict]) -> None:
        """Sends each worker its sub-envs' actions at once (one message per worker), so
        they step while the caller finishes its round; `poll` collects the results.
        A worker pinned to the CPU this process runs on is sent its actions last
        (`subprocess_cpu`)."""
        prefetched = self._replies.prefetched
        for env_id in actions:
            if not 0 <= env_id < self.num_envs:
                raise EnvError(f"send_actions: env_id {env_id!r} is not in [0, {self.num_envs})")
            if prefetched:
                prefetched.pop(env_id, None)  # stepped without try_reset: the reset is stale
        if not self.async_poll:
            # The next poll hands the results out in this order, as SyncVectorEnv does.
            self._round_order.update(dict.fromkeys(actions))
        requests: list[list[Any]] = [[] for _ in self._workers]
        worker_of_env = self._worker_of_env
        for env_id, env_actions in actions.items():
            requests[worker_of_env[env_id]].append((env_id, env_actions))
        # Workers pinned to this process's CPU last: waking one hands it this CPU.
        here = current_cpu() if self._pinned else None
        last = []
        for worker, request in zip(self._workers, requests):
            if request:
                if here is not None and worker.cpu == here:
                    last.append((worker, request))
                else:
                    self._send_step(worker, request)
        for worker, request in last:
            self._send_step(worker, request)

    def try_reset(
        self,
        env_id: EnvID,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        """Resets the sub-env; a step result of it not handed out yet is dropped, as a
        reset supersedes it (with async pools, a step may be in flight or read but not
        polled when the runner gives up its episode)."""
        outcome = self._reset(env_id, seed, options)
        self._replies.drop_step_result(env_id)
        return outcome

    def _reset(
        self, env_id: EnvID, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        if env_id in self._restarts.crashed:
            self.try_restart(env_id)
        self._restarts.stale.discard(env_id)
        seed = self._seeds.for_reset(env_id, seed)
        replied = self._replies.reset_replies.pop(env_id, None)  # an interrupted try_reset's
        if replied is not None:
            return self._replies.reset_outcome(env_id, replied)
        prefetched = self._replies.prefetched.pop(env_id, None)
        if prefetched is not None and seed is None and options is None:
            self.stats.prefetched_resets += 1
            return self._replies.reset_outcome(env_id, prefetched)
        worker = self._workers[self._worker_of_env[env_id]]
        if not worker.alive:
            # A failed reset, as BaseEnv says; one the runner does not retry (restarts off).
            return SubEnvGoneError(
                f"sub-env {env_id} cannot be reset: its worker {worker.index} is gone (it died, "
                "or was killed after a timeout); "
                "enable restart_failed_sub_environments to recreate it"
            ), {}
        self.stats.reset_round_trips += 1
        self._send(worker, "reset", [(env_id, seed, options)])
        self._collect(worker)
        return self._replies.reset_outcome(env_id, self._replies.reset_replies.pop(env_id))

    def try_restart(self, env_id: EnvID) -> None:
        """Recreate the sub-env in its worker, or the whole worker if it died."""
        worker = self._workers[self._worker_of_env[env_id]]
        if worker.alive:
            reply = self._request(worker, "restart", env_id)
            if worker.alive:
                if isinstance(reply, Crash):
                    raise EnvError(f"sub-env {env_id}: recreating it failed") from reply.error
                self._note_recreated([env_id])
                return
        replacement = self._launcher.launch(worker.index, worker.env_ids)
        self._workers[worker.index] = replacement
        try:
            await_ready(replacement)
        except BaseException:
            replacement.kill()
            raise
        # The worker's other sub-envs are new, unreset envs now.
        self._note_recreated(worker.env_ids, [e for e in worker.env_ids if e != env_id])

    def try_render(self, env_id: EnvID | None = None) -> Any:
        env_id = 0 if env_id is None else env_id
        worker = self._workers[self._worker_of_env[env_id]]
        reply = self._request(worker, "render", env_id)
        if not worker.alive:
            raise EnvError(f"sub-env {env_id} cannot be rendered: its worker {worker.index} died")
        if isinstance(reply, Crash):
            raise reply.error
        return reply

    def stop(self) -> None:
        self._finalizer()
        if self._probe_env is not None:
            close_within(self._probe_env, SHUTDOWN_TIMEOUT_S, "the local env read for spaces")
            self._probe_env = None

    @property
    def worker_pids(self) -> list[int]:
        """Each worker's process id, by worker index (a restarted worker's new one), for
        tools that watch the workers (their memory, their CPU)."""
        return [worker.process.pid for worker in self._workers]

    @property
    def possible_agents(self) -> list[AgentID]:
        return list(self._probe().possible_agents)

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        return self._probe().get_observation_space(agent)

    def get_action_space(self, agent: AgentID) -> gym.Space:
        return self._probe().get_action_space(agent)

    def _probe(self) -> MultiAgentEnv:
        """A local env to answer space questions without a round trip
        (which could collide with a pending step)."""
        if self._probe_env is None:
            self._probe_env = self._make_one(0)
        return self._probe_env

    # ---- workers

    def _lose(self, worker: WorkerHandle, reason: str | None = None, hung: EnvID | None = None) -> None:
        """Kill `worker`; the sub-envs of its unanswered request fail, saying why.

        `reason` None: it died on its own. `hung`: the sub-env that timed out.
        """
        in_flight, worker.in_flight = worker.in_flight, None
        worker.unread = None
        worker.reply = None
        worker.kill()
        if reason is None:
            reason = f"{worker.describe()} died (exit code {worker.process.exitcode})"
        self._restarts.worker_lost(worker.env_ids)
        for env_id in worker.env_ids:
            self._replies.prefetched.pop(env_id, None)
        if in_flight is None or in_flight.kind in ("restart", "render"):
            return
        for env_id, *_ in in_flight.request:
            error = lost_worker_error(env_id, reason, worker.index, hung)
            if in_flight.kind == "reset":
                self._replies.reset_replies[env_id] = Crash(error)
            else:
                self._replies.fail(env_id, error)

    # ---- sending

    def _send(self, worker: WorkerHandle, kind: str, request: Any) -> bool:
        """Send one request (after reading the worker's last reply); False if the
        worker is dead, whose sub-envs then fail in the next poll."""
        if worker.in_flight is not None or worker.unread is not None:
            self._collect(worker)
        if not worker.alive:
            if kind in ("step", "start"):
                error = EnvError(f"{worker.describe()} is dead")
                for env_id, *_ in request:
                    self._replies.fail(env_id, error)
            elif kind == "reset":
                for env_id, *_ in request:
                    self._replies.reset_replies[env_id] = Crash(EnvError(f"{worker.describe()} is dead"))
            return False
        start = perf_counter()
        try:
            worker.in_flight = InFlight(kind, request, monotonic())
            if kind == "step":
                self._send_step_message(worker, request)
            else:
                send(worker.conn, ("reset" if kind == "start" else kind, request))
        except OSError:
            self._lose(worker)
            return False
        except BaseException as interruption:
            self._lose(
                worker,
                f"{worker.describe()} was killed: sending it a request was "
                f"interrupted by {type(interruption).__name__}",
            )
            raise
        self.stats.parent_ipc_s += perf_counter() - start
        return True

    def _send_step_message(self, worker: WorkerHandle, request: list[Any]) -> None:
        """The step request: the actions into the worker's slot block and one byte
        saying so, or pickled when one does not fit (or with key sets new to it)."""
        slots = worker.slots
        if slots is None:
            send(worker.conn, ("step", (request, ())))
        elif slots.write_request(worker.local, request):
            if slots.unsent:
                self.stats.pickled_step_messages += 1
                send(worker.conn, ("step", (None, slots.take_unsent())))
            else:
                worker.conn.send_bytes(STEP)
        else:
            self.stats.pickled_step_messages += 1
            send(worker.conn, ("step", (request, slots.take_unsent())))

    def _send_step(self, worker: WorkerHandle, request: list[tuple[EnvID, MultiAgentDict]]) -> None:
        """Send a worker its sub-envs' actions; sub-envs of a recreated worker that were
        not reset since fail instead."""
        request, stale = self._restarts.split_stale(request, worker.index)
        for env_id, error in stale:
            self._replies.fail(env_id, error)
        if request and self._send(worker, "step", request):
            self.stats.step_requests += 1

    def _request(self, worker: WorkerHandle, kind: str, env_id: EnvID) -> Any:
        """One restart/render request and its reply; None (the worker marked dead) if it died."""
        if not self._send(worker, kind, env_id):
            return None
        self._collect(worker)
        reply, worker.reply = worker.reply, None
        return reply

    # ---- receiving

    def _collect_replies(self, wanted: int | None) -> None:
        """Read replies in the order they come (the first worker's results are copied out
        while the others still step) until `wanted` sub-env results are in or no worker
        is busy (None: until none is), then those ready now."""
        for worker in self._workers:
            if worker.unread is not None:
                self._collect(worker)
        ready = self._replies.ready[0]
        busy = [worker for worker in self._workers if worker.in_flight is not None]
        while busy and (wanted is None or len(ready) < wanted):
            start = perf_counter()
            answered = wait([worker.conn for worker in busy], timeout=self._wait_s(busy))
            self.stats.parent_wait_s += perf_counter() - start
            for worker in busy:
                if worker.conn in answered:
                    self._collect(worker)
                else:
                    self._time_out_if_late(worker)
            busy = [worker for worker in busy if worker.in_flight is not None]
        if busy:
            answered = wait([worker.conn for worker in busy], timeout=0)
            for worker in busy:
                if worker.conn in answered:
                    self._collect(worker)

    def _deadline(self, worker: WorkerHandle) -> float:
        """When the worker's current env call (or the request) runs out of time."""
        assert worker.in_flight is not None and self.step_timeout_s is not None
        return max(worker.in_flight.sent_at, worker.progress[1]) + self.step_timeout_s

    def _wait_s(self, workers: list[WorkerHandle]) -> float | None:
        if self.step_timeout_s is None:
            return None
        return max(min(self._deadline(w) for w in workers) - monotonic(), 0.0)

    def _time_out_if_late(self, worker: WorkerHandle) -> bool:
        """Kill the worker if its env call ran out of time; True if it did."""
        if self.step_timeout_s is None or worker.in_flight is None:
            return False
        if monotonic() < self._deadline(worker):
            return False
        in_flight = worker.in_flight
        hung_id = int(worker.progress[0])
        call = "reset" if in_flight.kind in ("start", "reset") else in_flight.kind
        reason = timeout_reason(hung_id, call, self.step_timeout_s, worker.describe())
        if hung_id < 0:
            hung_id = in_flight.request[0][0] if isinstance(in_flight.request, list) else -1
        self._lose(worker, reason, hung=hung_id)
        return True

    def _collect(self, worker: WorkerHandle) -> None:
        """Read the worker's outstanding reply (waiting at most until its deadline)
        and enter it: step results into the next poll's, reset results for try_reset."""
        if worker.unread is None:
            in_flight = worker.in_flight
            if in_flight is None:
                return
            start = perf_counter()
            while not worker.conn.poll(self._wait_s([worker])):
                if self._time_out_if_late(worker):
                    self.stats.parent_wait_s += perf_counter() - start
                    return
            try:
                data = worker.conn.recv_bytes()
            except (EOFError, OSError):
                self.stats.parent_wait_s += perf_counter() - start
                self._lose(worker)
                return
            except BaseException as interruption:
                self._lose(
                    worker,
                    f"{worker.describe()} was killed: reading its reply was "
                    f"interrupted by {type(interruption).__name__}",
                )
                raise
            worker.unread = (in_flight, data)
            worker.in_flight = None
            self.stats.parent_wait_s += perf_counter() - start
        in_flight, data = worker.unread
        start = perf_counter()
        reply = DONE if data == DONE else pickle.loads(data)
        self._replies.enter(worker, in_flight, reply, self.stats)
        worker.unread = None
        self.stats.parent_ipc_s += perf_counter() - start

    def _note_recreated(self, env_ids: list[EnvID], unreset: list[EnvID] = ()) -> None:
        self._restarts.recreated(env_ids, unreset)
        self._replies.forget(env_ids)


def _envs_per_poll(num_envs_per_poll: int | None, async_poll: bool, num_envs: int) -> int:
    """The `num_envs_per_poll` asked for, checked; `async_poll` is short for 1."""
    if num_envs_per_poll is None:
        return 1 if async_poll else num_envs
    if async_poll:
        raise EnvError(
            f"async_poll and num_envs_per_poll={num_envs_per_poll!r} both given: async_poll is "
            "short for num_envs_per_poll=1; give one of them"
        )
    if (
        not isinstance(num_envs_per_poll, int)
        or isinstance(num_envs_per_poll, bool)
        or not 1 <= num_envs_per_poll <= num_envs
    ):
        raise EnvError(
            f"num_envs_per_poll {num_envs_per_poll!r}: expected an int in [1, num_envs={num_envs}]"
        )
    return num_envs_per_poll
