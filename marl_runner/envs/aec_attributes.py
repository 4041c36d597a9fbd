"""An AEC env's per-step attributes, read past the PettingZoo wrappers that only forward them.

PettingZoo wraps every classic env in three of its own wrappers (order
enforcing, out-of-bounds check, illegal-move termination), and each forwards
a missing attribute to the env it wraps with ``__getattr__``. The AEC adapter
reads ``agents``, ``agent_selection``, ``terminations``, ``truncations``,
``rewards`` and ``infos`` about eight times per env step, so every read paid
one ``__getattr__`` per wrapper: about a fifth of a connect_four step. Those
wrappers neither define nor set these names (the illegal-move wrapper writes
them on the unwrapped env), so each name is read from the first object in the
chain that can hold it. A wrapper of any other module is never looked past:
it may define or set any of them, and then it is where the name is read.
Before PettingZoo 1.25 the illegal-move wrapper set flags, rewards and the
selected agent on itself, so with those versions nothing is looked past.
"""

from __future__ import annotations

import re
from typing import Any

import pettingzoo

#: Wrappers of this package only forward the names read here (checked per name and class).
_FORWARDING_PACKAGE = "pettingzoo.utils.wrappers."
#: From this PettingZoo version on, its wrappers write these names only on the unwrapped env.
_FORWARDING_SINCE = (1, 25)


def _version(text: str) -> tuple[int, ...]:
    """``"1.27.0"`` -> ``(1, 27, 0)``; the leading numbers only (``"1.25.0rc1"`` -> ``(1, 25, 0)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


_WRAPPERS_ONLY_FORWARD = _version(pettingzoo.__version__) >= _FORWARDING_SINCE


def attribute_owner(env: Any, name: str) -> Any:
    """The object in ``env``'s wrapper chain whose attribute ``name`` reading ``env.<name>``
    ends at: PettingZoo's own wrappers that merely forward it are skipped."""
    while _only_forwards(env, name):
        env = env.env
    return env


def _only_forwards(wrapper: Any, name: str) -> bool:
    cls = type(wrapper)
    return (
        _WRAPPERS_ONLY_FORWARD
        and cls.__module__.startswith(_FORWARDING_PACKAGE)
        and "env" in vars(wrapper)
        and name not in vars(wrapper)
        and not any(name in vars(klass) for klass in cls.__mro__)
    )


class AECState:
    """Reads of the env's per-step attributes, each from its owner (``attribute_owner``).

    Owners are found once: a wrapper chain does not change, and each read
    still goes to the owning object, so values the env replaces every step
    (``rewards = {...}``) are always the current ones.
    """

    __slots__ = ("_agents", "_selection", "_terminations", "_truncations", "_rewards", "_infos")

    def __init__(self, env: Any) -> None:
        self._agents = attribute_owner(env, "agents")
        self._selection = attribute_owner(env, "agent_selection")
        self._terminations = attribute_owner(env, "terminations")
        self._truncations = attribute_owner(env, "truncations")
        self._rewards = attribute_owner(env, "rewards")
        self._infos = attribute_owner(env, "infos")

    @property
    def agents(self) -> list:
        """Agents still in the episode (PettingZoo removes finished ones)."""
        return self._agents.agents

    @property
    def agent_selection(self) -> Any:
        """The agent whose turn it is."""
        return self._selection.agent_selection

    @property
    def terminations(self) -> dict:
        """Each agent's terminated flag."""
        return self._terminations.terminations

    @property
    def truncations(self) -> dict:
        """Each agent's truncated flag."""
        return self._truncations.truncations

    @property
    def rewards(self) -> dict:
        """The rewards of the last env.step call (not the cumulative ones)."""
        return self._rewards.rewards

    @property
    def infos(self) -> dict:
        """Each agent's info dict."""
        return self._infos.infos
