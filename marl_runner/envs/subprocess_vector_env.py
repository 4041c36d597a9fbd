"""N sub-envs in worker processes on this machine, stepped in parallel."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from time import perf_counter
from typing import Any

import gymnasium as gym

from marl_runner.envs.base_env import (
    BaseEnv,
    EnvID,
    PollResult,
    ResetSeeds,
    close_quietly,
    put_failure,
    put_reset,
)
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv
from marl_runner.envs.shared_obs import SharedObs, SharedObsReader
from marl_runner.envs.subprocess_worker import (
    Crash,
    Malformed,
    receive,
    send,
    worker_main,
)

# Never "fork": the parent usually holds torch threads, which a fork can deadlock.
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
_SHUTDOWN_TIMEOUT_S = 5.0


class _Worker:
    """The parent's handle on one worker process and the sub-envs it runs."""

    def __init__(
        self, index: int, env_ids: list[EnvID], process: BaseProcess, conn: Connection
    ) -> None:
        self.index = index
        self.env_ids = env_ids
        self.process = process
        self.conn = conn
        self.obs_reader = SharedObsReader()
        self.alive = True
        #: The step request (`[(env_id, actions), ...]`) whose reply is still
        #: in the pipe (asynchronous mode only; at most one at a time).
        self.in_flight: list[tuple[EnvID, MultiAgentDict]] | None = None

    def death_error(self) -> EnvError:
        """Mark the worker dead (reaping the process) and describe its death."""
        self.alive = False
        self.process.join(timeout=_SHUTDOWN_TIMEOUT_S)
        self.conn.close()
        self.obs_reader.detach(unlink=True)  # the worker had no chance to free it
        return EnvError(
            f"worker {self.index} (pid {self.process.pid}) running sub-envs {self.env_ids} "
            f"died (exit code {self.process.exitcode})"
        )

    def shut_down(self) -> None:
        """Ask the worker to close its envs and exit; kill it if it does not."""
        if self.alive:
            self.alive = False
            try:
                send(self.conn, ("close", None))
                # Replies come in request order: an unread step reply precedes the close's.
                for _ in range(2 if self.in_flight is not None else 1):
                    if self.conn.poll(_SHUTDOWN_TIMEOUT_S):
                        self.conn.recv_bytes()
            except (OSError, EOFError):
                pass  # already gone: joining below reaps it
            self.conn.close()
        self.obs_reader.detach()
        self.process.join(timeout=_SHUTDOWN_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


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
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _shut_down_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.shut_down()


class SubprocessVectorEnv(BaseEnv):
    """Sub-envs spread over worker processes, several per worker.

    Default (synchronous) protocol: `poll` sends every worker the actions of
    its sub-envs, then collects the replies, so workers step in parallel;
    results equal SyncVectorEnv's for the same seed (same seeding rule, same
    order), and so do a runner's batches.

    Asynchronous protocol (`async_poll=True`): `send_actions` forwards each
    worker its sub-envs' actions at once, and `poll` returns the results of
    whichever workers are ready (waiting for at least one), so workers step
    while the caller works on the others' results. Each sub-env still
    appears in exactly one poll per action dict it was sent, and every
    sub-env is seeded as under SyncVectorEnv; but which sub-envs share a
    poll depends on timing, so a runner's batches (the grouping of rows into
    rounds, episode ids, fragment boundaries) are not reproducible run to
    run and differ from `sync`'s. Every batch invariant holds.

    Resets: a worker resets a sub-env right after the step that ended its
    episode (`"__all__"` terminated or truncated), unseeded as SyncVectorEnv
    would, and sends the reset obs with that step's results; `try_reset`
    then answers from them without a round trip (its failures reported as
    for any reset). `try_reset` with a `seed`, `options`, or on a recreated
    sub-env (whose first reset is seeded) discards that reset and resets
    again: for an unseeded reset with `options` the env's RNG then differs
    from SyncVectorEnv's. Rendering after an episode's last step shows the
    new episode.

    Messages are pickled lists of per-sub-env results over one pipe per
    worker, except obs dicts of equal-shaped arrays: those go through a
    shared-memory block per worker (see `shared_obs`), copied out when the
    reply is read, before the worker's next request.

    A sub-env exception becomes that sub-env's Exception entry, with the
    worker's traceback in its `__notes__`. A worker that dies turns each of
    its sub-envs stepped that round into an `EnvError` entry naming worker and
    sub-envs. Resetting a dead worker's sub-env recreates the worker when
    `restart_failed` (or after `try_restart`), else raises `EnvError`.

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
        async_poll: the asynchronous protocol (see above).
        pin_workers: when the workers and this process fill the CPUs this
            process may use (`num_workers` or `num_workers + 1` of them, at
            least 2), pin worker i to the i-th of them and make it a
            `SCHED_BATCH` task (see `subprocess_worker.pin_to_cpu`); this
            process stays unpinned. With 2 workers on 2 CPUs that is worth
            ~15% of throughput on env-bound workloads (KAZ: 1.38x -> 1.56x
            over sync). Linux only; elsewhere, or with more CPUs, a no-op.
    """

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_envs: int,
        seed: int | None = None,
        restart_failed: bool = False,
        num_workers: int | None = None,
        async_poll: bool = False,
        pin_workers: bool = True,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise EnvError(f"num_envs {num_envs!r}: expected an int >= 1")
        if num_workers is None:
            num_workers = min(num_envs, os.cpu_count() or 1)
        if not isinstance(num_workers, int) or not 1 <= num_workers <= num_envs:
            raise EnvError(
                f"num_workers {num_workers!r}: expected an int in [1, num_envs={num_envs}]"
            )
        try:
            pickle.dumps(make_one)
        except Exception as error:
            raise EnvError(
                f"the env creator {make_one!r} cannot be pickled for worker processes ({error}); "
                "use a 'module:callable' env name or register a module-level function"
            ) from error
        self.num_envs = num_envs
        self.async_poll = bool(async_poll)
        self.stats = SubprocessStats()
        self._make_one = make_one
        self._seeds = ResetSeeds(seed, num_envs)
        self._restart_failed = restart_failed
        self._context = mp.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            # Workers fork from a server that imported this package once,
            # instead of each importing numpy, pettingzoo (and torch) anew.
            self._context.set_forkserver_preload([worker_main.__module__])
        env_blocks = [
            list(range(num_envs * w // num_workers, num_envs * (w + 1) // num_workers))
            for w in range(num_workers)
        ]
        self._worker_of_env = [w for w, block in enumerate(env_blocks) for _ in block]
        self._worker_cpus = _worker_cpus(num_workers) if pin_workers else [None] * num_workers
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shut_down_all, self._workers)
        self._workers.extend(self._launch(w, block) for w, block in enumerate(env_blocks))
        try:
            for worker in self._workers:
                self._await_ready(worker)
        except BaseException:
            self._finalizer()
            raise
        self._crashed: set[EnvID] = set()
        self._pending_actions: dict[EnvID, MultiAgentDict] = {}
        #: Reset results (obs already copied out) sent with an episode's last step.
        self._prefetched: dict[EnvID, Any] = {}
        #: Asynchronous mode: results read but not yet returned by `poll`.
        self._ready: PollResult = _empty_poll()
        self._started = False
        self._probe_env: MultiAgentEnv | None = None

    def reset_stats(self) -> SubprocessStats:
        """The stats so far; starts counting afresh."""
        stats, self.stats = self.stats, SubprocessStats()
        return stats

    def poll(self) -> PollResult:
        if not self._started:
            self._started = True
            poll = _empty_poll()
            requests = [
                [(env_id, self._seeds.for_reset(env_id), None) for env_id in worker.env_ids]
                for worker in self._workers
            ]
            results = self._exchange("reset", requests)
            for env_id in range(self.num_envs):
                put_reset(poll, env_id, *self._reset_outcome(env_id, results[env_id]))
            return poll
        self.stats.polls += 1
        if self.async_poll:
            return self._poll_ready()

        poll = _empty_poll()
        actions, self._pending_actions = self._pending_actions, {}
        if not actions:
            return poll
        requests: list[list[Any]] = [[] for _ in self._workers]
        worker_of_env = self._worker_of_env
        for env_id, env_actions in actions.items():
            requests[worker_of_env[env_id]].append((env_id, env_actions))
        # Read every reply before entering any: a malformed result raises, and the
        # other workers must not be left with unread replies.
        replies = [self._receive(worker) for worker in self._send_steps(requests, poll)]
        for reply in replies:
            self._enter(poll, *reply)
        return poll

    def send_actions(self, actions: dict[EnvID, MultiAgentDict]) -> None:
        prefetched = self._prefetched
        for env_id in actions:
            if not 0 <= env_id < self.num_envs:
                raise EnvError(f"send_actions: env_id {env_id!r} is not in [0, {self.num_envs})")
            if prefetched:
                prefetched.pop(env_id, None)  # stepped without try_reset: the reset is stale
        if not self.async_poll:
            self._pending_actions.update(actions)
            return
        requests: list[list[Any]] = [[] for _ in self._workers]
        worker_of_env = self._worker_of_env
        for env_id, env_actions in actions.items():
            requests[worker_of_env[env_id]].append((env_id, env_actions))
        for worker, request in zip(self._workers, requests):
            if request and worker.in_flight is not None:
                # Only when a caller sends a worker's sub-envs actions while others of
                # it are still stepping (a runner never does): one request at a time.
                self._collect(worker, self._ready)
        self._send_steps(requests, self._ready)

    def try_reset(
        self,
        env_id: EnvID,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        if env_id in self._crashed:
            self.try_restart(env_id)
        seed = self._seeds.for_reset(env_id, seed)
        prefetched = self._prefetched.pop(env_id, None)
        if prefetched is not None and seed is None and options is None:
            self.stats.prefetched_resets += 1
            return self._reset_outcome(env_id, prefetched)
        worker = self._workers[self._worker_of_env[env_id]]
        if not worker.alive:
            raise EnvError(
                f"sub-env {env_id} cannot be reset: its worker {worker.index} died; "
                "enable restart_failed_sub_environments to recreate it"
            )
        self._settle(worker)
        requests: list[list[Any]] = [[] for _ in self._workers]
        requests[worker.index] = [(env_id, seed, options)]
        self.stats.reset_round_trips += 1
        result = self._exchange("reset", requests)[env_id]
        return self._reset_outcome(env_id, result)

    def try_restart(self, env_id: EnvID) -> None:
        """Recreate the sub-env in its worker, or the whole worker if it died."""
        worker = self._workers[self._worker_of_env[env_id]]
        if worker.alive:
            reply = self._request(worker, ("restart", env_id))
            if isinstance(reply, Crash):
                raise EnvError(f"sub-env {env_id}: recreating it failed") from reply.error
            if worker.alive:
                self._note_recreated([env_id])
                return
        replacement = self._launch(worker.index, worker.env_ids)
        self._workers[worker.index] = replacement
        self._await_ready(replacement)
        self._note_recreated(worker.env_ids)

    def try_render(self, env_id: EnvID | None = None) -> Any:
        env_id = 0 if env_id is None else env_id
        worker = self._workers[self._worker_of_env[env_id]]
        reply = self._request(worker, ("render", env_id))
        if not worker.alive:
            raise EnvError(f"sub-env {env_id} cannot be rendered: its worker {worker.index} died")
        if isinstance(reply, Crash):
            raise reply.error
        return reply

    def stop(self) -> None:
        self._finalizer()
        if self._probe_env is not None:
            close_quietly(self._probe_env, 0)
            self._probe_env = None

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

    def _launch(self, index: int, env_ids: list[EnvID]) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=worker_main,
            args=(child_conn, self._make_one, env_ids, index, self._worker_cpus[index]),
            name=f"marl-runner-env-worker-{index}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return _Worker(index, env_ids, process, parent_conn)

    def _await_ready(self, worker: _Worker) -> None:
        try:
            reply = receive(worker.conn)
        except (EOFError, OSError):
            raise EnvError(
                f"{worker.death_error()} before creating its sub-envs; see its stderr. "
                "A script that starts worker processes must guard its entry point with "
                "`if __name__ == '__main__':`, and cannot be read from stdin"
            ) from None
        if reply != "ready":
            raise EnvError(
                f"worker {worker.index} could not create its sub-envs {worker.env_ids}: {reply.error}"
            ) from reply.error

    # ---- asynchronous protocol

    def _poll_ready(self) -> PollResult:
        """The results read so far plus those of every worker ready now; waits
        for one when there are none (and some worker is stepping)."""
        poll, self._ready = self._ready, _empty_poll()
        busy = [worker for worker in self._workers if worker.in_flight is not None]
        if not busy:
            return poll
        start = perf_counter()
        ready = wait([worker.conn for worker in busy], timeout=0 if poll[0] else None)
        self.stats.parent_wait_s += perf_counter() - start
        for worker in busy:
            if worker.conn in ready:
                self._collect(worker, poll)
        return poll

    def _settle(self, worker: _Worker) -> None:
        """Read the worker's outstanding step reply (into the next poll's results),
        so that another request can follow."""
        if worker.in_flight is not None:
            self._collect(worker, self._ready)

    # ---- steps

    def _send_steps(self, requests: list[list[Any]], poll: PollResult) -> list[_Worker]:
        """Send each worker its share of a step; a dead worker's sub-envs fail in `poll`."""
        asked = []
        stats = self.stats
        for worker, request in zip(self._workers, requests):
            if not request:
                continue
            if worker.alive:
                start = perf_counter()
                try:
                    send(worker.conn, ("step", request))
                except OSError:
                    pass
                else:
                    stats.parent_ipc_s += perf_counter() - start
                    stats.step_requests += 1
                    worker.in_flight = request
                    asked.append(worker)
                    continue
            error = self._note_death(worker)
            for env_id, _ in request:
                put_failure(poll, env_id, self._failure(env_id, Crash(error)))
        return asked

    def _collect(self, worker: _Worker, poll: PollResult) -> None:
        """Read the worker's step reply into `poll`."""
        self._enter(poll, *self._receive(worker))

    def _receive(self, worker: _Worker) -> tuple[list[Any], list[Any]]:
        """Read the worker's step reply: `(request, results)`, obs copied out of the
        shared block; the reset results that came with it are kept for `try_reset`."""
        request, worker.in_flight = worker.in_flight, None
        assert request is not None
        stats = self.stats
        start = perf_counter()
        try:
            data = worker.conn.recv_bytes()
        except (EOFError, OSError):
            stats.parent_wait_s += perf_counter() - start
            return request, [Crash(self._note_death(worker))] * len(request)
        received = perf_counter()
        stats.parent_wait_s += received - start
        new_block_name, results, resets, env_s, busy_s = pickle.loads(data)
        stats.worker_env_s += env_s
        stats.worker_busy_s += busy_s
        stats.env_steps += len(results)
        reader = worker.obs_reader
        if new_block_name is not None:
            reader.attach(new_block_name)
        for result in results:
            if type(result) is list and type(result[0]) is SharedObs:
                result[0] = reader.unpack(result[0])
        for env_id, result in resets.items():
            if type(result) is tuple and type(result[0]) is SharedObs:
                result = (reader.unpack(result[0]), result[1])
            self._prefetched[env_id] = result
        stats.parent_ipc_s += perf_counter() - received
        return request, results

    def _enter(self, poll: PollResult, request: list[Any], results: list[Any]) -> None:
        """Enter a step reply's results into `poll`; a malformed one raises EnvError."""
        obs, rewards, terminateds, truncateds, infos, off_policy_actions = poll
        for (env_id, _), result in zip(request, results):
            if type(result) is list:
                (
                    obs[env_id],
                    rewards[env_id],
                    terminateds[env_id],
                    truncateds[env_id],
                    infos[env_id],
                ) = result
                off_policy_actions[env_id] = {}
            else:
                put_failure(poll, env_id, self._failure(env_id, result))

    # ---- requests other than steps

    def _request(self, worker: _Worker, message: tuple[str, Any]) -> Any:
        """One request/reply with one worker; None (and the worker marked dead) if it died."""
        self._settle(worker)
        if not worker.alive:
            return None
        try:
            send(worker.conn, message)
            return receive(worker.conn)
        except (EOFError, OSError):
            self._note_death(worker)
            return None

    def _exchange(self, command: str, requests: list[list[Any]]) -> dict[EnvID, Any]:
        """Send each worker its share of a (reset) request, then gather every reply.

        A dead worker's sub-envs get a `Crash` holding an EnvError.
        """
        results: dict[EnvID, Any] = {}
        asked: list[_Worker] = []
        for worker, request in zip(self._workers, requests):
            if not request:
                continue
            if worker.alive:
                try:
                    send(worker.conn, (command, request))
                    asked.append(worker)
                    continue
                except OSError:
                    pass
            self._record_death(worker, request, results)
        for worker in asked:
            request = requests[worker.index]
            start = perf_counter()
            try:
                new_block_name, replies = receive(worker.conn)
            except (EOFError, OSError):
                self._record_death(worker, request, results)
                continue
            finally:
                self.stats.parent_wait_s += perf_counter() - start
            if new_block_name is not None:
                worker.obs_reader.attach(new_block_name)
            for (env_id, *_), reply in zip(request, replies):
                results[env_id] = reply
        return results

    def _record_death(self, worker: _Worker, request: list[Any], results: dict[EnvID, Any]) -> None:
        error = self._note_death(worker)
        for env_id, *_ in request:
            results[env_id] = Crash(error)

    def _note_death(self, worker: _Worker) -> EnvError:
        worker.in_flight = None
        error = (
            worker.death_error()
            if worker.alive
            else EnvError(f"worker {worker.index} running sub-envs {worker.env_ids} is dead")
        )
        if self._restart_failed:
            self._crashed.update(worker.env_ids)
        return error

    def _reset_outcome(
        self, env_id: EnvID, result: Any
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        if type(result) is tuple:
            obs, infos = result
            if type(obs) is SharedObs:
                obs = self._workers[self._worker_of_env[env_id]].obs_reader.unpack(obs)
            return obs, infos
        return self._failure(env_id, result), {}

    def _failure(self, env_id: EnvID, result: Crash | Malformed) -> Exception:
        """The Exception entry for a crashed sub-env; malformed output raises."""
        if isinstance(result, Malformed):
            raise EnvError(result.message)
        if self._restart_failed:
            self._crashed.add(env_id)
        return result.error

    def _note_recreated(self, env_ids: list[EnvID]) -> None:
        for env_id in env_ids:
            self._seeds.recreated(env_id)
            self._crashed.discard(env_id)
            self._prefetched.pop(env_id, None)


def _worker_cpus(num_workers: int) -> list[int | None]:
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


def _empty_poll() -> PollResult:
    return ({}, {}, {}, {}, {}, {})
