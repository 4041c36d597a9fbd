"""Shape checks on what a sub-env's reset/step return, shared by the vector envs.

They run on every step, so they only look at types and the `"__all__"` keys.
"""

from __future__ import annotations

from typing import Any

from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentDict, StepResult

_STEP_NAMES = ("obs", "rewards", "terminateds", "truncateds", "infos")


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
