"""N sub-envs stepped one after the other in this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from marl_runner.envs.base_env import (
    BaseEnv,
    EnvID,
    PollDicts,
    ResetSeeds,
    close_quietly,
    put_failure,
    put_reset,
)
from marl_runner.envs.checks import EnvOutputCheck, check_reset_result, check_step_result
from marl_runner.envs.errors import EnvError, EpisodeFault
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv
from marl_runner.envs.owned_copies import owned_copy, owned_infos


class SyncVectorEnv(BaseEnv):
    """Steps its sub-envs sequentially, inside `poll`.

    `send_actions` only records the actions; `poll` steps every sub-env that
    got some (so the runner's "env wait" timer around `poll` measures the
    env), then returns their results. An empty action dict still steps its
    sub-env: a round where no agent had to act is still a round.

    Exceptions raised by a sub-env's `step` or `reset` become that sub-env's
    entry (see `BaseEnv`); the others are unaffected. With `restart_failed`,
    a sub-env that raised is recreated via `make_one` before its next reset,
    unless the runner already called `try_restart` for it.

    Bad output (see `checks`: malformed dicts, undeclared agents, non-finite
    rewards, with `check_env_outputs` obs outside their space) is an
    `EnvError` naming sub-env, agent and field. With `restart_failed` it is
    that sub-env's entry, like a crash; without, `poll` raises it once the
    round is over, and the next `poll` returns the others' results and the
    bad sub-env's failure entry. Nothing is lost when `poll` is interrupted
    (KeyboardInterrupt) either: sub-envs not stepped yet keep their actions,
    results already read wait for the next `poll`, and the sub-env whose
    `step` was interrupted (its state unknown) fails with an `EnvError`.

    Args:
        make_one: builds sub-env `index`.
        num_envs: number of sub-envs.
        seed: sub-env i's first reset gets `seed + i`; later resets are
            unseeded, so the whole run is reproducible from `seed`.
        restart_failed: recreate crashed sub-envs automatically.
        check_env_outputs: also check every obs against its agent's space.
    """

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_envs: int,
        seed: int | None = None,
        restart_failed: bool = False,
        check_env_outputs: bool = False,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise EnvError(f"num_envs {num_envs!r}: expected an int >= 1")
        self.num_envs = num_envs
        self._make_one = make_one
        self._seeds = ResetSeeds(seed, num_envs)
        self._restart_failed = restart_failed
        self._check_spaces = check_env_outputs
        self.envs: list[MultiAgentEnv] = []
        self._checks: list[EnvOutputCheck] = []
        for env_id in range(num_envs):
            env = make_one(env_id)
            self.envs.append(env)
            self._checks.append(EnvOutputCheck(env, env_id, check_env_outputs))
        self._crashed: set[EnvID] = set()
        self._pending_actions: dict[EnvID, MultiAgentDict] = {}
        #: Sub-envs whose first reset is still to come (all of them until the first poll).
        self._unstarted = list(range(num_envs))
        #: Results of this round read so far (kept when `poll` is interrupted).
        self._ready: PollDicts = ({}, {}, {}, {}, {}, {})
        self._stopped = False

    def poll(self) -> PollDicts:
        ready = self._ready
        bad_output: EnvError | None = None
        unstarted = self._unstarted
        while unstarted:
            env_id = unstarted[0]
            obs, infos = self._reset(env_id, None, None, ready)
            put_reset(ready, env_id, obs, infos)
            del unstarted[0]
            if isinstance(obs, EnvError) and not self._restart_failed:
                bad_output = bad_output or obs
        actions = self._pending_actions
        envs = self.envs
        checks = self._checks
        stepped = 0  # actions[:stepped] are done with, should the loop be cut short
        try:
            for env_id, env_actions in actions.items():
                env = envs[env_id]
                try:
                    obs, rewards, terminateds, truncateds, infos = check_step_result(
                        env.step(env_actions), env_id, env
                    )
                    checks[env_id].step(obs, rewards, terminateds, truncateds)
                except EnvError as error:
                    stepped += 1
                    self._fail(ready, env_id, error)
                    if not self._restart_failed:
                        bad_output = bad_output or error
                    continue
                except Exception as error:
                    stepped += 1
                    self._fail(ready, env_id, error)
                    continue
                except BaseException as interruption:
                    stepped += 1
                    self._fail(ready, env_id, _interrupted(env_id, "step", interruption))
                    raise
                stepped += 1
                if terminateds.get("__all__") or truncateds.get("__all__"):  # reset next
                    obs, rewards, terminateds, truncateds, infos = owned_copy(
                        (obs, rewards, terminateds, truncateds, infos)
                    )
                else:
                    infos = owned_infos(infos)
                ready[0][env_id] = obs
                ready[1][env_id] = rewards
                ready[2][env_id] = terminateds
                ready[3][env_id] = truncateds
                ready[4][env_id] = infos
                ready[5][env_id] = {}
        except BaseException:
            for env_id in list(actions)[:stepped]:
                del actions[env_id]
            raise
        actions.clear()
        if bad_output is not None:
            raise bad_output
        self._ready = ({}, {}, {}, {}, {}, {})
        return ready

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
        obs, infos = self._reset(env_id, seed, options)
        if isinstance(obs, EnvError) and not self._restart_failed:
            raise obs
        return obs, infos

    def try_restart(self, env_id: EnvID) -> None:
        close_quietly(self.envs[env_id], env_id)
        env = self._make_one(env_id)
        self.envs[env_id] = env
        self._checks[env_id] = EnvOutputCheck(env, env_id, self._check_spaces)
        self._seeds.recreated(env_id)
        self._crashed.discard(env_id)

    def try_render(self, env_id: EnvID | None = None) -> Any:
        return self.envs[0 if env_id is None else env_id].render()

    def get_sub_environments(self) -> list[MultiAgentEnv]:
        return list(self.envs)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for env_id, env in enumerate(self.envs):
            close_quietly(env, env_id)

    @property
    def possible_agents(self) -> list[AgentID]:
        return list(self.envs[0].possible_agents)

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        return self.envs[0].get_observation_space(agent)

    def get_action_space(self, agent: AgentID) -> gym.Space:
        return self.envs[0].get_action_space(agent)

    def _reset(
        self,
        env_id: EnvID,
        seed: int | None,
        options: dict[str, Any] | None,
        ready: PollDicts | None = None,
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        """Reset one sub-env (recreating it first if it crashed); a failure is the obs.

        An interruption fails the sub-env (into `ready`, when given) and propagates.
        """
        if env_id in self._crashed:
            self.try_restart(env_id)
        env = self.envs[env_id]
        try:
            result = env.reset(seed=self._seeds.for_reset(env_id, seed), options=options)
            obs, infos = check_reset_result(result, env_id, env)
            self._checks[env_id].reset(obs)
        except Exception as error:
            self._note_crash(env_id)
            return error, {}
        except BaseException as interruption:
            error = _interrupted(env_id, "reset", interruption)
            if ready is not None:
                self._fail(ready, env_id, error)
            else:
                self._note_crash(env_id)
            raise
        return obs, infos

    def _fail(self, ready: PollDicts, env_id: EnvID, error: Exception) -> None:
        self._note_crash(env_id)
        put_failure(ready, env_id, error)

    def _note_crash(self, env_id: EnvID) -> None:
        if self._restart_failed:
            self._crashed.add(env_id)


def _interrupted(env_id: EnvID, call: str, interruption: BaseException) -> EpisodeFault:
    """The failure entry of a sub-env whose `call` was cut short (e.g. by Ctrl-C): its
    episode's state is unknown, but the env did nothing wrong: a reset puts it right."""
    error = EpisodeFault(
        f"sub-env {env_id}: its {call} was interrupted by {type(interruption).__name__}; "
        "its state is unknown, so its episode is dropped"
    )
    error.__cause__ = interruption
    return error
