"""N sub-envs, each a Ray actor; `poll` batches whichever answered in time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import ray
import ray.exceptions
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from marl_runner.envs.base_env import BaseEnv, EnvID, PollDicts, ResetSeeds, put_failure, put_reset
from marl_runner.envs.checks import check_reset_result, check_step_result
from marl_runner.envs.errors import EnvError, SubEnvGoneError
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv
from marl_runner.ray_support import init_ray

_RESET, _STEP = "reset", "step"


class _Malformed:
    """A sub-env's output broke the MultiAgentEnv contract (raised on the driver)."""

    def __init__(self, message: str) -> None:
        self.message = message


class SubEnvActor:
    """One sub-env in its own Ray actor; its outputs are checked where they are made."""

    def __init__(self, make_one: Callable[[int], MultiAgentEnv], env_id: EnvID) -> None:
        self.env_id = env_id
        self.env = make_one(env_id)

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> Any:
        """Checked in the actor, so a malformed reset becomes a `_Malformed`, not a crash."""
        result = self.env.reset(seed=seed, options=options)
        try:
            return check_reset_result(result, self.env_id, self.env)
        except EnvError as error:
            return _Malformed(str(error))

    def step(self, actions: MultiAgentDict) -> Any:
        """Checked in the actor, so a malformed step becomes a `_Malformed`, not a crash."""
        result = self.env.step(actions)
        try:
            return check_step_result(result, self.env_id, self.env)
        except EnvError as error:
            return _Malformed(str(error))

    def ready(self) -> bool:
        """Answers once the env is built, so a restarted actor's boot can be awaited."""
        return True

    def spaces(self) -> tuple[list[AgentID], dict[AgentID, gym.Space], dict[AgentID, gym.Space]]:
        """Agents and spaces for the driver, which has no env of its own to ask."""
        agents = list(self.env.possible_agents)
        return (
            agents,
            {agent: self.env.get_observation_space(agent) for agent in agents},
            {agent: self.env.get_action_space(agent) for agent in agents},
        )

    def render(self) -> Any:
        """The env lives in the actor, so `try_render` has to ask it here."""
        return self.env.render()

    def close(self) -> None:
        """Lets the env free its resources before `stop` kills the actor."""
        self.env.close()


class RayVectorEnv(BaseEnv):
    """Each sub-env is a Ray actor stepping on its own; `poll` never waits for all.

    `send_actions` starts the listed sub-envs' steps at once; `poll` waits
    until at least `num_envs_per_poll` of the sub-envs it waits on answered
    (default 1), then returns those and whoever else answers within
    `batch_wait_ms`, so a slow sub-env never holds the fast ones back and
    each policy's forward pass batches whoever is ready. Resets are asynchronous:
    `try_reset` returns None and the reset obs arrive in a later poll (sub-env
    i's first reset is seeded `seed + i`, later ones unseeded, as under
    SyncVectorEnv). The first poll starts every sub-env's reset.

    A sub-env that raises, an actor that dies (`ray.kill`, a crash, OOM) or a
    step/reset slower than `step_timeout_s` (its actor is then killed) is a
    faulty sub-env: its obs entry is the Exception and its
    `terminateds["__all__"]` True. `try_restart` replaces its actor; with
    `restart_failed` that also happens by itself before its next reset.
    Malformed output raises `EnvError`. `stop` kills every actor.

    Which sub-envs share a poll depends on timing, so a runner's batches are
    not reproducible run to run; each sub-env's own episodes are (for a
    deterministic policy), and every batch invariant holds.

    Args:
        make_one: builds sub-env `index` inside its actor; pickled to Ray.
        num_envs: number of sub-envs (actors).
        seed: sub-env i's first reset gets `seed + i`.
        restart_failed: recreate faulty sub-envs before their next reset.
        num_cpus: Ray CPUs reserved per actor (0: envs share the CPUs freely).
        batch_wait_ms: how long `poll` waits for more sub-envs once one is ready.
        step_timeout_s: a step or reset slower than this is a fault; None: wait forever.
        num_envs_per_poll: the fewest sub-envs a `poll` waits for (fewer when fewer
            are stepping); `num_envs` waits for every sub-env; default 1.
    """

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_envs: int,
        seed: int | None = None,
        restart_failed: bool = False,
        num_cpus: float = 0,
        batch_wait_ms: float = 0,
        step_timeout_s: float | None = 60.0,
        num_envs_per_poll: int | None = None,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise EnvError(f"num_envs {num_envs!r}: expected an int >= 1")
        if num_envs_per_poll is None:
            num_envs_per_poll = 1
        if (
            not isinstance(num_envs_per_poll, int)
            or isinstance(num_envs_per_poll, bool)
            or not 1 <= num_envs_per_poll <= num_envs
        ):
            raise EnvError(
                f"num_envs_per_poll {num_envs_per_poll!r}: expected an int in "
                f"[1, num_envs={num_envs}]"
            )
        init_ray()  # joins RAY_ADDRESS's cluster, else starts one; token auth stays on
        self.num_envs = num_envs
        self.num_envs_per_poll = num_envs_per_poll
        self._make_one = make_one
        self._seeds = ResetSeeds(seed, num_envs)
        self._restart_failed = restart_failed
        self._batch_wait_s = max(float(batch_wait_ms), 0.0) / 1000.0
        self._step_timeout_s = step_timeout_s
        self._actor_class = ray.remote(num_cpus=num_cpus, max_restarts=0)(SubEnvActor)
        self._actors = [self._make_actor(env_id) for env_id in range(num_envs)]
        self._spaces = self._await_actors()
        #: Requests in flight: object ref -> (env_id, kind, start time).
        self._pending: dict[ray.ObjectRef, tuple[EnvID, str, float]] = {}
        self._crashed: set[EnvID] = set()
        #: Recreated actors not known to be up yet: env_id -> their `ready` reply.
        self._booting: dict[EnvID, ray.ObjectRef] = {}
        self._started = False
        self._stopped = False

    @property
    def actors(self) -> list[Any]:
        """The sub-envs' Ray actor handles, by env_id (e.g. to kill one in a test)."""
        return list(self._actors)

    def _make_actor(self, env_id: EnvID) -> Any:
        return self._actor_class.remote(self._make_one, env_id)

    # ------------------------------------------------------------------ the protocol

    def poll(self) -> PollDicts:
        poll: PollDicts = ({}, {}, {}, {}, {}, {})
        if not self._started:
            self._started = True
            for env_id in range(self.num_envs):
                self._start_reset(env_id, None, None)
        if not self._pending:
            return poll
        for ref in self._ready_refs():
            env_id, kind, _ = self._pending.pop(ref)
            self._enter(poll, env_id, kind, ref)
        self._time_out_overdue(poll)
        return _sorted_by_env(poll)

    def send_actions(self, actions: dict[EnvID, MultiAgentDict]) -> None:
        now = time.perf_counter()
        for env_id, env_actions in actions.items():
            if not 0 <= env_id < self.num_envs:
                raise EnvError(f"send_actions: env_id {env_id!r} is not in [0, {self.num_envs})")
            ref = self._actors[env_id].step.remote(env_actions)
            self._pending[ref] = (env_id, _STEP, now)

    def try_reset(
        self,
        env_id: EnvID,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if env_id in self._crashed:
            self.try_restart(env_id)
        self._start_reset(env_id, seed, options)
        return None

    def try_restart(self, env_id: EnvID) -> None:
        """Kill the sub-env's actor (whatever state it is in) and start a new one."""
        self._forget_requests(env_id)
        ray.kill(self._actors[env_id], no_restart=True)
        self._actors[env_id] = self._make_actor(env_id)
        self._booting[env_id] = self._actors[env_id].ready.remote()
        self._seeds.recreated(env_id)
        self._crashed.discard(env_id)

    def try_render(self, env_id: EnvID | None = None) -> Any:
        return ray.get(self._actors[0 if env_id is None else env_id].render.remote())

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._pending.clear()
        closes = [actor.close.remote() for actor in self._actors]
        try:
            ray.wait(closes, num_returns=len(closes), timeout=5.0)
        finally:
            for actor in self._actors:
                ray.kill(actor, no_restart=True)

    @property
    def possible_agents(self) -> list[AgentID]:
        return list(self._probe()[0])

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        return self._probe()[1][agent]

    def get_action_space(self, agent: AgentID) -> gym.Space:
        return self._probe()[2][agent]

    # ------------------------------------------------------------------ internals

    def _probe(self) -> tuple[list[AgentID], dict, dict]:
        return self._spaces

    def _await_actors(self) -> tuple[list[AgentID], dict, dict]:
        """Wait until every actor has built its env (so that start-up never counts
        against the step timeout, and a failing env creator fails here); returns
        sub-env 0's agents and spaces."""
        replies = [actor.spaces.remote() for actor in self._actors]
        for env_id, reply in enumerate(replies):
            try:
                spaces = ray.get(reply)
            except RayTaskError as error:
                self.stop()
                raise EnvError(
                    f"sub-env {env_id}: building the env in its Ray actor failed: "
                    f"{error.as_instanceof_cause()}"
                ) from None
            if env_id == 0:
                probe = spaces
        return probe

    def _start_reset(self, env_id: EnvID, seed: int | None, options: dict | None) -> None:
        self._forget_requests(env_id)
        seed = self._seeds.for_reset(env_id, seed)
        ref = self._actors[env_id].reset.remote(seed, options)
        self._pending[ref] = (env_id, _RESET, time.perf_counter())

    def _forget_requests(self, env_id: EnvID) -> None:
        """Drop the sub-env's unanswered requests (a reset supersedes them)."""
        for ref in [ref for ref, (owner, _, _) in self._pending.items() if owner == env_id]:
            del self._pending[ref]

    def _ready_refs(self) -> list[ray.ObjectRef]:
        """At least `num_envs_per_poll` answers (or every pending one) unless a request
        times out first, plus whoever else answers within the batch wait."""
        refs = list(self._pending)
        wanted = min(self.num_envs_per_poll, len(refs))
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._batch_wait_s)
        if len(ready) >= wanted:
            return ready
        ready, _ = ray.wait(refs, num_returns=wanted, timeout=self._time_to_first_deadline())
        if ready:  # sweep up whatever else is ready by now
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return ready

    def _time_to_first_deadline(self) -> float | None:
        if self._step_timeout_s is None:
            return None
        oldest = min(start for _, _, start in self._pending.values())
        return max(oldest + self._step_timeout_s - time.perf_counter(), 0.0)

    def _time_out_overdue(self, poll: PollDicts) -> None:
        """Fail the requests older than the step timeout, except those still waiting
        for their actor to start: their clock starts again (start-up is no step)."""
        if self._step_timeout_s is None:
            return
        now = time.perf_counter()
        for ref, (env_id, kind, start) in list(self._pending.items()):
            if now - start < self._step_timeout_s:
                continue
            if self._still_booting(env_id):
                self._pending[ref] = (env_id, kind, now)
                continue
            del self._pending[ref]
            ray.kill(self._actors[env_id], no_restart=True)  # it may be stuck for good
            self._note_crash(env_id)
            put_failure(
                poll,
                env_id,
                EnvError(
                    f"sub-env {env_id}: {kind} took longer than sub_env_step_timeout_s="
                    f"{self._step_timeout_s} s ({now - start:.1f} s); its actor was killed"
                ),
            )

    def _still_booting(self, env_id: EnvID) -> bool:
        """True while a recreated actor has not started; the first time it is found
        started, also True (its requests are then timed from now)."""
        booting = self._booting.pop(env_id, None)
        if booting is None:
            return False
        started, _ = ray.wait([booting], timeout=0)
        if not started:
            self._booting[env_id] = booting
        return True

    def _enter(self, poll: PollDicts, env_id: EnvID, kind: str, ref: ray.ObjectRef) -> None:
        self._booting.pop(env_id, None)  # it answered: it is up
        try:
            result = ray.get(ref, timeout=0)
        except (RayActorError, RayTaskError, GetTimeoutError) as error:
            self._note_crash(env_id)
            put_failure(poll, env_id, _as_env_failure(env_id, kind, error))
            return
        if isinstance(result, _Malformed):
            raise EnvError(result.message)
        if kind == _RESET:
            put_reset(poll, env_id, *result)
            return
        (
            poll[0][env_id],
            poll[1][env_id],
            poll[2][env_id],
            poll[3][env_id],
            poll[4][env_id],
        ) = result
        poll[5][env_id] = {}

    def _note_crash(self, env_id: EnvID) -> None:
        if self._restart_failed:
            self._crashed.add(env_id)


#: A dead actor, not one that is only unreachable for now (ActorUnavailableError, also a
#: RayActorError); Ray before 2.10 has no such split.
_ACTOR_DIED = getattr(ray.exceptions, "ActorDiedError", RayActorError)


def _as_env_failure(env_id: EnvID, kind: str, error: Exception) -> Exception:
    """The env's own exception where it raised one; else an EnvError naming the death."""
    if isinstance(error, RayTaskError):
        return error.as_instanceof_cause()
    if isinstance(error, _ACTOR_DIED):  # actors are made with max_restarts=0: gone for good
        return SubEnvGoneError(f"sub-env {env_id}: its Ray actor died during {kind}: {error}")
    return EnvError(f"sub-env {env_id}: its Ray actor died during {kind}: {error}")


def _sorted_by_env(poll: PollDicts) -> PollDicts:
    """Entries in env_id order, as SyncVectorEnv gives them (rows of a round stay ordered)."""
    if len(poll[0]) < 2:
        return poll
    order = sorted(poll[0])
    return tuple({env_id: part[env_id] for env_id in order} for part in poll)  # type: ignore[return-value]
