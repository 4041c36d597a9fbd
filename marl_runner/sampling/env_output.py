"""What the vector env hands the runner in one round, by name instead of by position."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from marl_runner.envs.step_block import BlockRow

_NOTHING: dict = {}


class SubEnvOutput(NamedTuple):
    """One sub-env's output of one round, each field ``agent_id -> value``.

    Reset obs are an output too (no rewards, no flags), so a reset sub-env's
    first obs join the round through the same door as a stepped one's.
    """

    obs: dict
    rewards: dict
    terminateds: dict
    truncateds: dict
    infos: dict

    @classmethod
    def of_reset(cls, obs: dict, infos: dict) -> SubEnvOutput:
        """The obs and infos a reset returned."""
        return cls(obs, _NOTHING, _NOTHING, _NOTHING, infos)

    @property
    def all_terminated(self) -> bool:
        """The whole episode terminated (``terminateds['__all__']``)."""
        return bool(self.terminateds.get("__all__", False))

    @property
    def all_truncated(self) -> bool:
        """The whole episode was cut short (``truncateds['__all__']``), e.g. a time limit."""
        return bool(self.truncateds.get("__all__", False))

    @property
    def episode_over(self) -> bool:
        """The episode ended this round (terminated or truncated as a whole)."""
        return self.all_terminated or self.all_truncated


class PollResult(NamedTuple):
    """``BaseEnv.poll_blocks()``'s six dicts (``PollDicts``, by position) by name, each
    ``env_id -> agent_id -> value``.

    A failed sub-env's ``obs`` entry is its Exception (see ``BaseEnv``); a sub-env
    whose result came in a ``StepBlock`` has its ``BlockRow`` there instead, and no
    entry in the other dicts.
    """

    obs: dict
    rewards: dict
    terminateds: dict
    truncateds: dict
    infos: dict
    off_policy_actions: dict

    def of(self, env_id: int) -> SubEnvOutput:
        """Sub-env ``env_id``'s part (missing dicts read as empty; a ``BlockRow`` made dicts)."""
        obs = self.obs[env_id]
        if type(obs) is BlockRow:
            return SubEnvOutput(*obs.output())
        return SubEnvOutput(
            obs,
            self.rewards.get(env_id) or _NOTHING,
            self.terminateds.get(env_id) or _NOTHING,
            self.truncateds.get(env_id) or _NOTHING,
            self.infos.get(env_id) or _NOTHING,
        )

    def off_policy(self) -> dict[int, Any]:
        """``env_id -> agent_id -> action`` the env chose itself, for the sub-envs that did."""
        return {env_id: logged for env_id, logged in self.off_policy_actions.items() if logged}


def poll_method(env: Any) -> Callable[[], tuple]:
    """``env.poll_blocks`` where its class defines it at least as specifically as ``poll``,
    else ``env.poll``: a subclass or wrapper that changes what ``poll`` hands out (a
    duck-typed one forwarding the rest by ``__getattr__`` too) is never bypassed."""
    owners = type(env).__mro__
    blocks_owner = next((owner for owner in owners if "poll_blocks" in vars(owner)), None)
    poll_owner = next((owner for owner in owners if "poll" in vars(owner)), None)
    if blocks_owner is not None and poll_owner is not None and issubclass(blocks_owner, poll_owner):
        return env.poll_blocks
    return env.poll
