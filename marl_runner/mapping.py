"""Policy mapping, in one place: which policy each agent plays.

A mapping function binds each agent of an episode to a policy id:
``fn(agent_id, episode, **kwargs) -> policy_id``. Users may write it as a
function (in code or as a ``"module:function"`` import path), as a dict of
agent-id globs, or leave it out when there is a single policy
(``make_policy_mapping_fn``). ``AgentMapping`` is the runner's live mapping
(the keyword arguments it passes, replacing it between samples);
``infer_policy_spaces`` derives each policy's spaces from the agents mapped
to it. Episodes cache an agent's policy (``MultiAgentEpisode.policy_for``);
``PolicyMap`` builds a policy when its first agent is mapped to it.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import gymnasium as gym

from connectors.imports import import_object
from marl_runner.config import ConfigError

__all__ = [
    "AgentMapping",
    "PolicyMappingError",
    "PolicyMappingFn",
    "SpaceMismatchError",
    "infer_policy_spaces",
    "make_policy_mapping_fn",
]

PolicyMappingFn = Callable[..., str]


class PolicyMappingError(ConfigError):
    """A mapping that cannot be built, or that gives an agent no known policy id.

    A config problem (key ``policy_mapping_fn``), whether found by ``validate``
    or while sampling; its own type so that callers can tell it from errors
    raised inside a user's mapping function.
    """

    def __init__(self, problem: str) -> None:
        super().__init__("policy_mapping_fn", problem)


class SpaceMismatchError(ConfigError):
    """Agents mapped to one policy disagree on their spaces, or a policy does not fit them."""


class AgentMapping:
    """The runner's mapping: the user's (any form), called with the keyword arguments
    it asks for out of ``context`` (``runner``, ``worker``), its result checked against
    ``policy_ids`` (a live view, so policies added later count)."""

    def __init__(
        self,
        spec: Callable[..., Any] | str | Mapping[str, str] | None,
        policy_ids: Collection[str],
        context: Mapping[str, Any],
    ) -> None:
        self._policy_ids = policy_ids
        self._context = dict(context)
        self._fn = make_policy_mapping_fn(spec, policy_ids)

    def __call__(self, agent_id: Any, episode: Any) -> str:
        """The policy id ``agent_id`` plays in ``episode``."""
        return self._fn(agent_id, episode, **self._context)

    def replace(self, spec: Callable[..., Any] | str | Mapping[str, str]) -> None:
        """A new mapping for agents mapped from now on (see ``EnvRunner.set_policy_mapping_fn``)."""
        self._fn = make_policy_mapping_fn(spec, self._policy_ids)


def infer_policy_spaces(
    agents: Iterable[Any],
    policy_for: Callable[[Any], str],
    observation_space: Callable[[Any], gym.Space],
    action_space: Callable[[Any], gym.Space],
) -> dict[str, tuple[gym.Space, gym.Space, Any]]:
    """``policy_id -> (obs_space, action_space, first agent)`` from the agents mapped to it.

    Raises:
        SpaceMismatchError: two agents of one policy have different spaces.
    """
    spaces: dict[str, tuple[gym.Space, gym.Space, Any]] = {}
    for agent in agents:
        policy_id = policy_for(agent)
        obs_space, act_space = observation_space(agent), action_space(agent)
        if policy_id not in spaces:
            spaces[policy_id] = (obs_space, act_space, agent)
            continue
        known_obs, known_act, first_agent = spaces[policy_id]
        for kind, known, space in (
            ("observation", known_obs, obs_space),
            ("action", known_act, act_space),
        ):
            if known != space:
                raise SpaceMismatchError(
                    f"policies.{policy_id}",
                    f"agents {first_agent!r} and {agent!r} both map to policy {policy_id!r} "
                    f"but have different {kind} spaces: {known} vs {space}; agents sharing "
                    f"a policy must share spaces (map them to different policies)",
                )
    return spaces


def make_policy_mapping_fn(
    spec: Callable[..., Any] | str | Mapping[str, str] | None,
    policy_ids: Collection[str],
) -> PolicyMappingFn:
    """Returns ``fn(agent_id, episode, **kwargs) -> policy_id`` for ``spec``.

    Args:
        spec: a callable; a ``"module:function"`` import path; a dict of
            ``fnmatch`` glob -> policy id (first matching pattern in dict
            order wins, matched against ``str(agent_id)``); or None when
            ``policy_ids`` holds exactly one id.
        policy_ids: the known policy ids. Every returned id is checked against
            it on each call, so pass a live view (``policy_map.keys()``) to
            allow policies added later.

    The returned function accepts and forwards only the keyword arguments
    the user's function declares, so a plain ``def fn(agent_id, episode)``
    works even when the runner passes extra context such as ``runner=``.

    Raises:
        PolicyMappingError: spec is None with more or fewer than one policy, or a glob
            dict names an unknown policy id; the returned function raises it
            when an agent matches no glob or a function returns an unknown id.
        ImportPathError: the import path cannot be resolved.
        TypeError: spec is none of the accepted forms.
    """
    if spec is None:
        if len(policy_ids) != 1:
            raise PolicyMappingError(
                f"required when there are {len(policy_ids)} policies "
                f"({_listing(policy_ids)}): give an import path 'module:function' or a "
                "mapping of agent-id glob -> policy id"
            )
        (only_policy,) = policy_ids
        return _SinglePolicyMapping(only_policy)
    if isinstance(spec, Mapping):
        return _GlobMapping(spec, policy_ids)
    if isinstance(spec, str):
        fn = import_object(spec)
        if not callable(fn):
            raise TypeError(
                f"policy_mapping_fn {spec!r} names a {type(fn).__name__}, not a function"
            )
        return _FunctionMapping(fn, policy_ids, name=spec)
    if callable(spec):
        return _FunctionMapping(spec, policy_ids, name=getattr(spec, "__qualname__", repr(spec)))
    raise TypeError(
        f"policy_mapping_fn: got {type(spec).__name__} {spec!r}, expected a callable, an import "
        "path 'module:function', a mapping of agent-id glob -> policy id, or None"
    )


class _SinglePolicyMapping:
    """Every agent plays the one policy there is."""

    def __init__(self, policy_id: str) -> None:
        self.policy_id = policy_id

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        return self.policy_id

    def __repr__(self) -> str:
        return f"<policy mapping: every agent -> {self.policy_id!r}>"


_MAX_MATCHED_NAMES = 65536


class _GlobMapping:
    """Agent-id globs checked in order; the first match names the policy."""

    def __init__(self, patterns: Mapping[str, str], policy_ids: Collection[str]) -> None:
        if not patterns:
            raise PolicyMappingError("the glob mapping is empty; expected {glob: policy id}")
        for pattern, policy_id in patterns.items():
            if policy_id not in policy_ids:
                raise PolicyMappingError(
                    f"pattern {pattern!r} maps to unknown policy id "
                    f"{policy_id!r}; known policies: {_listing(policy_ids)}"
                )
        self.patterns = dict(patterns)
        # Matching globs costs microseconds per agent at every episode start; the answer
        # for a name never changes.
        self._matched: dict[str, str] = {}

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        name = str(agent_id)
        policy_id = self._matched.get(name)
        if policy_id is not None:
            return policy_id
        for pattern, policy_id in self.patterns.items():
            if fnmatch.fnmatchcase(name, pattern):
                if len(self._matched) >= _MAX_MATCHED_NAMES:  # envs that mint fresh agent ids
                    self._matched.clear()
                self._matched[name] = policy_id
                return policy_id
        raise PolicyMappingError(
            f"agent {agent_id!r} matches none of the patterns "
            f"{_listing(self.patterns)}; add a pattern for it (e.g. '*' as the last entry)"
        )

    def __repr__(self) -> str:
        return f"<policy mapping: globs {self.patterns!r}>"


class _FunctionMapping:
    """A user function, called with the keyword arguments it accepts, its result checked."""

    def __init__(self, fn: Callable[..., Any], policy_ids: Collection[str], *, name: str) -> None:
        self.fn = fn
        self.name = name
        self.policy_ids = policy_ids
        self._accepted_kwargs = _accepted_keywords(fn)

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        if self._accepted_kwargs is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self._accepted_kwargs}
        policy_id = self.fn(agent_id, episode, **kwargs)
        if policy_id not in self.policy_ids:
            raise PolicyMappingError(
                f"{self.name} returned {policy_id!r} for agent {agent_id!r}, "
                f"which is not a known policy id; known policies: {_listing(self.policy_ids)}"
            )
        return policy_id

    def __repr__(self) -> str:
        return f"<policy mapping: {self.name}>"


def _accepted_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Names ``fn`` takes by keyword beyond (agent_id, episode); None means any (``**kwargs``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: pass no extras
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params[2:] if p.kind in keyword_kinds)


def _listing(names: Collection[Any]) -> str:
    return ", ".join(repr(n) for n in names) or "(none)"
