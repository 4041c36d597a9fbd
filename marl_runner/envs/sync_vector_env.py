"""N sub-envs stepped one after the other in this process."""

from __future__ import annotations

from collections.abc import Callable
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
from marl_runner.envs.checks import check_reset_result, check_step_result
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv


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

    Args:
        make_one: builds sub-env `index`.
        num_envs: number of sub-envs.
        seed: sub-env i's first reset gets `seed + i`; later resets are
            unseeded, so the whole run is reproducible from `seed`.
        restart_failed: recreate crashed sub-envs automatically.
    """

    def __init__(
        self,
        make_one: Callable[[int], MultiAgentEnv],
        num_envs: int,
        seed: int | None = None,
        restart_failed: bool = False,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise EnvError(f"num_envs {num_envs!r}: expected an int >= 1")
        self.num_envs = num_envs
        self._make_one = make_one
        self._seeds = ResetSeeds(seed, num_envs)
        self._restart_failed = restart_failed
        self.envs = [make_one(env_id) for env_id in range(num_envs)]
        self._crashed: set[EnvID] = set()
        self._pending_actions: dict[EnvID, MultiAgentDict] = {}
        self._started = False
        self._stopped = False

    def poll(self) -> PollResult:
        poll: PollResult = ({}, {}, {}, {}, {}, {})
        if not self._started:
            self._started = True
            for env_id in range(self.num_envs):
                put_reset(poll, env_id, *self.try_reset(env_id))
            return poll
        obs, rewards, terminateds, truncateds, infos, off_policy_actions = poll
        actions, self._pending_actions = self._pending_actions, {}
        envs = self.envs
        for env_id, env_actions in actions.items():
            env = envs[env_id]
            try:
                result = env.step(env_actions)
            except Exception as exc:
                self._note_crash(env_id)
                put_failure(poll, env_id, exc)
                continue
            (
                obs[env_id],
                rewards[env_id],
                terminateds[env_id],
                truncateds[env_id],
                infos[env_id],
            ) = check_step_result(result, env_id, env)
            off_policy_actions[env_id] = {}
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
        env = self.envs[env_id]
        try:
            result = env.reset(seed=self._seeds.for_reset(env_id, seed), options=options)
        except Exception as exc:
            self._note_crash(env_id)
            return exc, {}
        return check_reset_result(result, env_id, env)

    def try_restart(self, env_id: EnvID) -> None:
        close_quietly(self.envs[env_id], env_id)
        self.envs[env_id] = self._make_one(env_id)
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

    def _note_crash(self, env_id: EnvID) -> None:
        if self._restart_failed:
            self._crashed.add(env_id)
