"""Adapters from PettingZoo's Parallel and AEC APIs to MultiAgentEnv.

Named `pettingzoo_wrappers` so that it never shadows the `pettingzoo` package.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

from connectors.agent.env_state import ENV_STATE_INFO_KEY
from marl_runner.envs.aec_attributes import AECState
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv, StepResult

logger = logging.getLogger(__name__)


def _episode_end_flags(
    terminateds: MultiAgentDict, truncateds: MultiAgentDict, episode_over: bool
) -> tuple[bool, bool]:
    """`(terminated_all, truncated_all)`: an ended episode counts as truncated
    when any agent that ended with it was truncated (a time limit), else as
    terminated, so that value bootstrapping stays right."""
    if not episode_over:
        return False, False
    truncated_all = any(truncateds.values())
    return not truncated_all, truncated_all


def _name(env: Any) -> str:
    return type(getattr(env, "unwrapped", env)).__qualname__


def _kind(value: Any) -> str:
    """``a tuple of 4``, ``a dict with keys ['a', 'b']``: what an env returned, briefly."""
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, dict):
        return f"a dict with keys {list(value)[:4]} (the obs alone?)"
    return f"a {type(value).__name__}"


def _check_flag(env: Any, kind: str, agent: AgentID, flag: Any) -> None:
    """A set termination/truncation flag must be a bool (numpy's too) or 1: a string such
    as "no" is truthy and would end the agent."""
    if (
        flag is True
        or isinstance(flag, np.bool_)
        or (isinstance(flag, int | np.integer) and flag == 1)
    ):
        return
    raise EnvError(
        f"{_name(env)} gave {kind}[{agent!r}] = {flag!r} ({type(flag).__name__}); expected "
        "true or false"
    )


def _unlisted_agent_error(env: Any, live: AECState, agent: AgentID) -> EnvError:
    lacking = [
        name
        for name, table in (
            ("terminations", live.terminations),
            ("truncations", live.truncations),
            ("infos", live.infos),
        )
        if agent not in table
    ]
    listed = "in" if agent in live.agents else "not in"
    lacks = f"which env.{' and env.'.join(lacking)} {'lacks' if len(lacking) == 1 else 'lack'}"
    return EnvError(
        f"AEC env {_name(env)} selected agent {agent!r} ({listed} env.agents), "
        f"{lacks if lacking else 'whose flags or infos cannot be read'}; expected "
        "agent_selection to be one of env.agents, each with a termination, a truncation and "
        "an infos entry"
    )


_BASE_STATE_METHODS = (ParallelEnv.state, AECEnv.state)


def _defines_state(env: Any) -> bool:
    """Whether ``env.state()`` can work: the env's class (or a wrapper of the user's)
    defines it, or, behind PettingZoo's own wrappers (which delegate), the unwrapped env's."""
    outer = getattr(type(env), "state", None)
    if outer is not None and outer not in _BASE_STATE_METHODS:
        if not getattr(outer, "__module__", "").startswith("pettingzoo.utils"):
            return True
    inner = getattr(type(getattr(env, "unwrapped", env)), "state", None)
    return inner is not None and inner not in _BASE_STATE_METHODS


def _no_state_error(env: Any, why: str) -> EnvError:
    return EnvError(
        f"env.capture_state is true, but {type(getattr(env, 'unwrapped', env)).__qualname__} "
        f"{why}; expected an env whose state() returns the global state (e.g. mpe2 "
        "simple_spread), or env.capture_state: false"
    )


class _PettingZooSpaces(MultiAgentEnv):
    """Space lookups shared by both wrappers, and the global state when asked for.

    Spaces are asked from the wrapped env on every call rather than cached,
    because some envs (e.g. PettingZoo's generated-agents fixtures) draw new
    spaces for new agent types each episode.

    With ``capture_state`` every agent handed out gets ``env.state()`` in a
    copy of its infos, under ``ENV_STATE_INFO_KEY``: computed here, where
    the env lives (a subprocess worker or Ray actor too), once per call and
    shared by the agents of that call. The runner's ``EnvStateAgentConnector``
    moves it into the ``env_state`` column.
    """

    env: Any
    capture_state: bool

    def _init_state_capture(self, capture_state: bool) -> None:
        """Refuses, when built, an env that cannot give its state."""
        self.capture_state = bool(capture_state)
        if self.capture_state and not _defines_state(self.env):
            raise _no_state_error(
                self.env, "does not implement state() (PettingZoo's global state)"
            )

    def _with_state(self, obs: MultiAgentDict, infos: MultiAgentDict) -> MultiAgentDict:
        """``infos`` with the env's state added for each agent in ``obs`` (copies, never the
        env's own dicts); unchanged without ``capture_state`` or agents."""
        if not self.capture_state or not obs:
            return infos
        try:
            state = self.env.state()
        except NotImplementedError:
            raise _no_state_error(self.env, "raises NotImplementedError from state()") from None
        if state is None:
            raise _no_state_error(self.env, "returns None from state()")
        return {
            **infos,
            **{agent: {**(infos.get(agent) or {}), ENV_STATE_INFO_KEY: state} for agent in obs},
        }

    def _init_spaces(self) -> None:
        # Some envs (generated agents) have no `possible_agents`: their agents
        # are only known once they appear.
        self.possible_agents = list(getattr(self.env, "possible_agents", []))
        self.observation_spaces = {a: self.env.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: self.env.action_space(a) for a in self.possible_agents}

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        return self.env.observation_space(agent)

    def get_action_space(self, agent: AgentID) -> gym.Space:
        return self.env.action_space(agent)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class ParallelPettingZooEnv(_PettingZooSpaces):
    """Wraps a `pettingzoo.ParallelEnv`; obs, rewards and infos pass through (infos
    copied, with the env's state added, under `capture_state`).

    Only `"__all__"` is added to copies of the flag dicts (never to the env's
    own dicts, which some envs keep using): the episode is over when
    `env.agents` is empty after a step, or when every agent still listed in
    it has been terminated or truncated (envs that never empty `agents`;
    a warning says so once per wrapper). Stepping a finished episode with
    no actions returns empty dicts instead of calling the env.
    """

    def __init__(self, env: ParallelEnv, capture_state: bool = False) -> None:
        self.env = env
        self._init_spaces()
        self._init_state_capture(capture_state)
        self._done_agents: set[AgentID] = set()
        self._episode_over = False
        self._warned_agents_kept = False

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        self._done_agents = set()
        self._episode_over = False
        result = self.env.reset(seed=seed, options=options)
        if not isinstance(result, tuple | list) or len(result) != 2:
            raise EnvError(
                f"{_name(self.env)}.reset returned {_kind(result)}; a ParallelEnv's reset "
                "returns (obs, infos), two dicts keyed by agent id"
            )
        obs, infos = result
        return obs, self._with_state(obs, infos)

    def step(self, actions: MultiAgentDict) -> StepResult:
        if not actions and (self._episode_over or not self.env.agents):
            return {}, {}, {"__all__": False}, {"__all__": False}, {}
        result = self.env.step(actions)
        try:
            obs, rewards, terminateds, truncateds, infos = result
        except (TypeError, ValueError):
            raise EnvError(
                f"{_name(self.env)}.step returned {_kind(result)}; a ParallelEnv's step returns "
                "5 dicts keyed by agent id: (obs, rewards, terminations, truncations, infos)"
            ) from None
        done = self._done_agents
        for kind, flags in (("terminations", terminateds), ("truncations", truncateds)):
            try:  # a flag that is not set is never looked at again, so only set ones are checked
                set_now = [(agent, flag) for agent, flag in flags.items() if flag]
            except AttributeError:
                raise EnvError(
                    f"{_name(self.env)}.step returned {kind} as {_kind(flags)}; expected a dict "
                    "of agent id -> bool"
                ) from None
            for agent, flag in set_now:
                _check_flag(self.env, kind, agent, flag)
                done.add(agent)
        listed = self.env.agents
        episode_over = not listed or all(agent in done for agent in listed)
        if episode_over and listed and not self._warned_agents_kept:
            self._warned_agents_kept = True
            logger.warning(
                "%s keeps terminated/truncated agents in env.agents (%s); the episode is "
                "ended because all of them are done (PettingZoo envs should remove them)",
                type(self.env).__name__,
                list(listed)[:5],
            )
        self._episode_over = episode_over
        terminated_all, truncated_all = _episode_end_flags(
            terminateds, truncateds, episode_over=episode_over
        )
        terminateds = {**terminateds, "__all__": terminated_all}
        truncateds = {**truncateds, "__all__": truncated_all}
        return obs, rewards, terminateds, truncateds, self._with_state(obs, infos)


class AECPettingZooEnv(_PettingZooSpaces):
    """Wraps a `pettingzoo.AECEnv` (turn-based) as a MultiAgentEnv.

    Mapping, per call of `step({agent: action})` for the agent to move:

    - obs / infos: the next live agent to move (`env.observe`, `env.infos`),
      preceded by every dead agent (terminated or truncated) the env selects
      on the way. A dead agent gets its final obs and its own flags and is
      then stepped with `None` here, so the caller never acts for it.
    - rewards: the sum of the step rewards (`env.rewards`, not the
      cumulative ones) of every `env.step` call made, for every agent the env
      listed, whether it has an obs now or not. Summing all rewards this
      wrapper returns therefore gives exactly what the env handed out; the
      runner credits a reward for an agent without obs to that agent's next
      (or final) transition. Non-zero rewards present right after
      `env.reset` are returned with the first step.
    - `"__all__"`: true once `env.agents` is empty; terminated unless an
      agent that ended in that round was truncated (then truncated).

    - `capture_state`: the env's state after the call, in copies of the infos
      of every agent returned.

    `reset` returns only the first live agent to move (dead agents selected
    before it are stepped out silently: they never had a turn). A `step` with
    an empty action dict is a no-op returning empty dicts when no agent is left
    to act; while an agent waits for its action it is an `EnvError`, because
    no progress is possible without that action.
    """

    def __init__(self, env: AECEnv, capture_state: bool = False) -> None:
        self.env = env
        # Per-step attributes read past the PettingZoo wrappers that only forward them.
        self._live = AECState(env)
        self._init_spaces()
        self._init_state_capture(capture_state)
        self._rewards_before_step: MultiAgentDict = {}

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        env, live = self.env, self._live
        env.reset(seed=seed, options=options)
        rewards = {agent: reward for agent, reward in live.rewards.items() if reward}
        obs, _, _, _, infos = self._advance_to_live_agent(rewards)
        if not live.agents:
            raise EnvError(f"AEC env {env} has no live agent after reset; expected one to move")
        self._rewards_before_step = rewards
        live_agent = live.agent_selection
        if len(obs) > 1:
            obs, infos = {live_agent: obs[live_agent]}, {live_agent: infos[live_agent]}
        return obs, self._with_state(obs, infos)

    def step(self, actions: MultiAgentDict) -> StepResult:
        env, live = self.env, self._live
        rewards, self._rewards_before_step = self._rewards_before_step, {}
        if not live.agents:
            if actions:
                raise EnvError(f"AEC env {env} has no agents left; got actions for {list(actions)}")
            return {}, rewards, {"__all__": False}, {"__all__": False}, {}
        agent = live.agent_selection
        if len(actions) != 1 or agent not in actions:
            raise EnvError(
                f"AEC env {env} waits for agent {agent!r} to move; "
                f"expected exactly its action, got actions for {list(actions)}"
            )
        env.step(actions[agent])
        self._add_step_rewards(rewards)
        obs, rewards, terminateds, truncateds, infos = self._advance_to_live_agent(rewards)
        return obs, rewards, terminateds, truncateds, self._with_state(obs, infos)

    def _add_step_rewards(self, rewards: MultiAgentDict) -> None:
        """Add the rewards of the last `env.step` call to `rewards`."""
        for agent, reward in self._live.rewards.items():
            rewards[agent] = rewards.get(agent, 0.0) + reward

    def _advance_to_live_agent(self, rewards: MultiAgentDict) -> StepResult:
        """Step out dead agents until a live one is selected or none is left."""
        env, live = self.env, self._live
        obs: MultiAgentDict = {}
        terminateds: MultiAgentDict = {}
        truncateds: MultiAgentDict = {}
        infos: MultiAgentDict = {}
        while live.agents:
            agent = live.agent_selection
            if agent in obs:
                raise EnvError(
                    f"AEC env {env} selected dead agent {agent!r} again after stepping it "
                    "with None; expected the env to remove it from env.agents"
                )
            try:
                terminated = live.terminations[agent]
                truncated = live.truncations[agent]
                infos[agent] = live.infos[agent]
            except KeyError:
                raise _unlisted_agent_error(env, live, agent) from None
            obs[agent] = env.observe(agent)
            terminateds[agent] = terminated
            truncateds[agent] = truncated
            if not (terminated or truncated):
                terminateds["__all__"] = truncateds["__all__"] = False
                return obs, rewards, terminateds, truncateds, infos
            _check_flag(
                env, "terminations" if terminated else "truncations", agent, terminated or truncated
            )
            env.step(None)
            self._add_step_rewards(rewards)
        terminated_all, truncated_all = _episode_end_flags(terminateds, truncateds, True)
        terminateds["__all__"] = terminated_all
        truncateds["__all__"] = truncated_all
        return obs, rewards, terminateds, truncateds, infos
