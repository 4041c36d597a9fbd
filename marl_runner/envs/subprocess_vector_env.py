"""N sub-envs in worker processes on this machine, stepped in parallel."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
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


def _shut_down_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.shut_down()


class SubprocessVectorEnv(BaseEnv):
    """Sub-envs spread over worker processes, several per worker.

    `poll` sends every worker the actions of its sub-envs, then collects the
    replies, so workers step in parallel; results equal SyncVectorEnv's for
    the same seed (same seeding rule, same order). Messages are pickled lists
    of per-sub-env results over one pipe per worker, except obs dicts of
    equal-shaped arrays: those go through a shared-memory block per worker
    (see `shared_obs`).

    A sub-env exception becomes that sub-env's Exception entry, with the
    worker's traceback in its `__notes__`. A worker that dies turns each of
    its sub-envs stepped that round into an `EnvError` entry naming worker and
    sub-envs. Resetting a dead worker's sub-env recreates the worker when
    `restart_failed` (or after `try_restart`), else raises `EnvError`.

    Args:
        make_one: builds sub-env `index`; pickled to the workers (use
            `marl_runner.envs.registry.EnvFactory` or a module-level function).
        num_envs: number of sub-envs.
        seed: as for SyncVectorEnv.
        restart_failed: recreate crashed sub-envs (and dead workers) before
            their next reset.
        num_workers: processes to use; default `min(num_envs, os.cpu_count())`.
    """

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_envs: int,
        seed: int | None = None,
        restart_failed: bool = False,
        num_workers: int | None = None,
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
        self._started = False
        self._probe_env: MultiAgentEnv | None = None

    def poll(self) -> PollResult:
        poll: PollResult = ({}, {}, {}, {}, {}, {})
        if not self._started:
            self._started = True
            requests = [
                [(env_id, self._seeds.for_reset(env_id), None) for env_id in worker.env_ids]
                for worker in self._workers
            ]
            results = self._exchange("reset", requests)
            for env_id in range(self.num_envs):
                put_reset(poll, env_id, *self._reset_outcome(env_id, results[env_id]))
            return poll

        actions, self._pending_actions = self._pending_actions, {}
        requests = [[] for _ in self._workers]
        worker_of_env = self._worker_of_env
        for env_id, env_actions in actions.items():
            requests[worker_of_env[env_id]].append((env_id, env_actions))
        results = self._exchange("step", requests)
        obs, rewards, terminateds, truncateds, infos, off_policy_actions = poll
        for env_id in actions:
            result = results[env_id]
            if type(result) is tuple:
                env_obs, rewards[env_id], terminateds[env_id], truncateds[env_id], infos[env_id] = (
                    result
                )
                if type(env_obs) is SharedObs:
                    env_obs = self._workers[worker_of_env[env_id]].obs_reader.unpack(env_obs)
                obs[env_id] = env_obs
                off_policy_actions[env_id] = {}
            else:
                put_failure(poll, env_id, self._failure(env_id, result))
        return poll

    def send_actions(self, actions: dict[EnvID, MultiAgentDict]) -> None:
        for env_id in actions:
            if not 0 <= env_id < self.num_envs:
                raise EnvError(f"send_actions: env_id {env_id!r} is not in [0, {self.num_envs})")
        self._pending_actions.update(actions)

    def try_reset(
        self,
        env_id: EnvID,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        if env_id in self._crashed:
            self.try_restart(env_id)
        worker = self._workers[self._worker_of_env[env_id]]
        if not worker.alive:
            raise EnvError(
                f"sub-env {env_id} cannot be reset: its worker {worker.index} died; "
                "enable restart_failed_sub_environments to recreate it"
            )
        requests: list[list[Any]] = [[] for _ in self._workers]
        requests[worker.index] = [(env_id, self._seeds.for_reset(env_id, seed), options)]
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
            args=(child_conn, self._make_one, env_ids, index),
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

    def _request(self, worker: _Worker, message: tuple[str, Any]) -> Any:
        """One request/reply with one worker; None (and the worker marked dead) if it died."""
        try:
            send(worker.conn, message)
            return receive(worker.conn)
        except (EOFError, OSError):
            self._note_death(worker)
            return None

    def _exchange(self, command: str, requests: list[list[Any]]) -> dict[EnvID, Any]:
        """Send each worker its share of a request, then gather every reply.

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
            try:
                new_block_name, replies = receive(worker.conn)
            except (EOFError, OSError):
                self._record_death(worker, request, results)
                continue
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
