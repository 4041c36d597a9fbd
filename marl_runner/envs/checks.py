"""Shape checks on what a sub-env's reset/step return, shared by the vector envs.

They run on every step, so they only look at types and the `"__all__"` keys;
`EnvOutputCheck` adds per-agent checks (declared agents, finite rewards,
obs in space) that cost a few set operations per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentDict, StepResult

_STEP_NAMES = ("obs", "rewards", "terminateds", "truncateds", "infos")
# Batches hold rewards as float32: a reward beyond its range would be inf there.
LARGEST_REWARD = float(np.finfo(np.float32).max)


def rewards_fit(rewards: Iterable[Any]) -> bool:
    """Whether every reward is a number float32 holds, in one C-level pass: if their
    magnitudes sum to no more than its largest value, each is that small (a NaN or inf
    sums to one). When not, the caller looks at each reward to name the bad one."""
    try:  # (fabs: a complex number has an abs too)
        return math.fsum(map(math.fabs, rewards)) <= LARGEST_REWARD
    except (TypeError, ValueError, OverflowError):
        return False


def check_step_result(result: Any, env_id: int, env: Any) -> StepResult:
    """Return `result` if it is `(obs, rewards, terminateds, truncateds, infos)`."""
    if type(result) is tuple and len(result) == 5:
        obs, rewards, terminateds, truncateds, infos = result
        if (
            type(obs) is dict
            and type(rewards) is dict
            and type(terminateds) is dict
            and type(truncateds) is dict
            and type(infos) is dict
            and "__all__" in terminateds
            and "__all__" in truncateds
        ):
            return result  # the fast path: exact types, no further checks
    return _check_step_result_slowly(result, env_id, env)


def _check_step_result_slowly(result: Any, env_id: int, env: Any) -> StepResult:
    """Accept lists and dict subclasses too; raise EnvError naming what is wrong."""
    if not isinstance(result, tuple | list) or len(result) != 5:
        raise EnvError(
            f"sub-env {env_id} ({type(env).__name__}): step returned {_describe(result)}; "
            "expected 5 dicts (obs, rewards, terminateds, truncateds, infos)"
        )
    for name, value in zip(_STEP_NAMES, result):
        if not isinstance(value, dict):
            raise EnvError(
                f"sub-env {env_id} ({type(env).__name__}): step returned {name} as "
                f"{_describe(value)}; expected a dict keyed by agent id"
            )
    for name, flags in (("terminateds", result[2]), ("truncateds", result[3])):
        if "__all__" not in flags:
            raise EnvError(
                f"sub-env {env_id} ({type(env).__name__}): step returned {name} without the "
                "'__all__' key; expected it in both terminateds and truncateds "
                "(PettingZoo envs get it from ParallelPettingZooEnv / AECPettingZooEnv)"
            )
    return tuple(result)  # type: ignore[return-value]


def check_reset_result(result: Any, env_id: int, env: Any) -> tuple[MultiAgentDict, MultiAgentDict]:
    """Return `result` if it is `(obs, infos)`, both dicts."""
    if (
        not isinstance(result, tuple | list)
        or len(result) != 2
        or not isinstance(result[0], dict)
        or not isinstance(result[1], dict)
    ):
        raise EnvError(
            f"sub-env {env_id} ({type(env).__name__}): reset returned {_describe(result)}; "
            "expected (obs, infos), two dicts keyed by agent id"
        )
    return result[0], result[1]


def _describe(value: Any) -> str:
    """A short description for error messages (never a huge repr)."""
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


class EnvOutputCheck:
    """Checks what one sub-env hands out, beyond the shape of the dicts.

    Raises `EnvError` naming the sub-env, the agent and the field for:
    an obs / reward / terminated / truncated flag for an agent the env never
    declared (not in `possible_agents`, and `env.get_observation_space(agent)`
    raises), a reward that is not a finite number, and (with
    `check_spaces`) an obs outside the agent's observation space.

    Agents spawned mid-episode are fine as long as the env answers
    `get_observation_space` for them; each agent is looked up once and then
    remembered, so the per-step cost is a few set inclusions and one `sum`.
    Build one per sub-env object (a recreated env needs a new one). Used by
    every vector env, in the process that holds the env.
    """

    def __init__(self, env: Any, env_id: int, check_spaces: bool = False) -> None:
        self.env = env
        self.env_id = env_id
        self.check_spaces = check_spaces
        self._agents: set[Any] = set(getattr(env, "possible_agents", None) or ())
        self._flag_keys = self._agents | {"__all__"}

    def step(
        self,
        obs: MultiAgentDict,
        rewards: MultiAgentDict,
        terminateds: MultiAgentDict,
        truncateds: MultiAgentDict,
    ) -> None:
        """Check a step's obs, rewards and flags (the dicts are known to be dicts)."""
        flag_keys = self._flag_keys
        agents = self._agents
        if not (
            obs.keys() <= agents
            and rewards.keys() <= agents
            and terminateds.keys() <= flag_keys
            and truncateds.keys() <= flag_keys
        ):
            for field, values in (
                ("an obs", obs),
                ("a reward", rewards),
                ("a terminated flag", terminateds),
                ("a truncated flag", truncateds),
            ):
                self._learn_agents(field, values, "step")
        if rewards and not rewards_fit(rewards.values()):
            self._check_rewards(rewards)
        if self.check_spaces:
            self._check_obs(obs, "step")

    def reset(self, obs: MultiAgentDict) -> None:
        """Check a reset's obs."""
        if not obs.keys() <= self._agents:
            self._learn_agents("an obs", obs, "reset")
        if self.check_spaces:
            self._check_obs(obs, "reset")

    def _where(self) -> str:
        return f"sub-env {self.env_id} ({type(self.env).__name__})"

    def _learn_agents(self, field: str, values: MultiAgentDict, call: str) -> None:
        """Remember the agents the env declares; raise for one it never declared."""
        for agent in values:
            if agent in self._agents or (agent == "__all__" and field.endswith("flag")):
                continue
            try:
                self.env.get_observation_space(agent)
            except Exception as error:
                raise EnvError(
                    f"{self._where()}: {call} returned {field} for agent {agent!r}, which the "
                    f"env never declared (not in possible_agents {sorted(self._agents, key=str)}, "
                    f"and get_observation_space({agent!r}) raised {type(error).__name__}); "
                    "expected only agents the env has spaces for"
                ) from None
            self._agents.add(agent)
            self._flag_keys.add(agent)

    def _check_rewards(self, rewards: MultiAgentDict) -> None:
        for agent, reward in rewards.items():
            try:
                finite = math.isfinite(reward)
            except OverflowError:  # an int past any float
                finite = False
            except TypeError:
                raise EnvError(
                    f"{self._where()}: step returned reward {reward!r} "
                    f"({type(reward).__name__}) for agent {agent!r}; expected a finite number"
                ) from None
            if not finite or abs(reward) > LARGEST_REWARD:
                raise EnvError(
                    f"{self._where()}: step returned reward {reward!r} for agent {agent!r}; "
                    f"expected a finite number a float32 holds (|reward| <= {LARGEST_REWARD:.4g}"
                    ": batches store rewards as float32)"
                )

    def _check_obs(self, obs: MultiAgentDict, call: str) -> None:
        for agent, value in obs.items():
            space = self.env.get_observation_space(agent)
            if not space.contains(value):
                raise EnvError(
                    f"{self._where()}: {call} returned an obs for agent {agent!r} outside its "
                    f"observation space {space}: got {describe_value(value)}"
                )


def describe_value(value: Any) -> str:
    """Type, shape, dtype and range of an obs, for error messages."""
    array = np.asarray(value) if not isinstance(value, dict | tuple) else None
    if array is None or array.dtype.hasobject:
        return _describe(value)
    text = f"{type(value).__name__} shape {array.shape} dtype {array.dtype}"
    if array.size and np.issubdtype(array.dtype, np.number):
        text += f" min {array.min()} max {array.max()}"
    return text
