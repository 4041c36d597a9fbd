"""Connector base classes and the context they are built from.

A connector is one small step between the env and a policy. Agent connectors
turn a round's raw per-agent rows into policy input; action connectors turn
policy output into env actions. Both work on whole columns at once (the
runner calls each pipeline once per policy per round), but a user connector
only needs to override the per-item ``transform`` method.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from connectors.data import (
    ActionConnectorDataType,
    ActionRows,
    AgentConnectorDataType,
    AgentRows,
)
from connectors.errors import ConnectorError

__all__ = [
    "ActionConnector",
    "AgentConnector",
    "Connector",
    "ConnectorContext",
    "ConnectorError",
]

if TYPE_CHECKING:
    from typing_extensions import Self


@dataclass
class ConnectorContext:
    """What a connector may know about its policy when it is built.

    ``observation_space`` is the env's original space (what the first agent
    connector receives). ``initial_states`` may be filled in after the policy
    is built; connectors read it lazily. ``view_requirements`` shape the
    policy's input (previous actions/rewards, frame stacking); changes are
    picked up lazily, except frame stacking, which changes the pipeline's
    output space: set it before building the pipeline (or call the
    pipeline's ``refresh_spaces()``).
    """

    observation_space: gym.Space
    action_space: gym.Space
    initial_states: list[Any] | None = None
    view_requirements: dict[str, Any] | None = None
    config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.config is None:
            self.config = {}

    @classmethod
    def from_policy(cls, policy: Any, observation_space: gym.Space | None = None) -> Self:
        """Context for ``policy``'s pipelines.

        A policy's own ``observation_space`` is usually the processed one (the
        agent pipeline's output); pass the env's space as
        ``observation_space`` in that case.
        """
        get_initial_state = getattr(policy, "get_initial_state", None)
        return cls(
            observation_space=(
                policy.observation_space if observation_space is None else observation_space
            ),
            action_space=policy.action_space,
            initial_states=list(get_initial_state()) if get_initial_state else None,
            view_requirements=getattr(policy, "view_requirements", None),
            config=dict(getattr(policy, "config", None) or {}),
        )


class Connector:
    """State and serialisation shared by agent and action connectors.

    Subclasses take ``ctx`` first and keyword parameters after it; ``params``
    returns those parameters so that ``to_state``/``from_state`` can rebuild an
    equal connector from JSON.
    """

    def __init__(self, ctx: ConnectorContext) -> None:
        self.ctx = ctx
        self.is_training = True

    def in_training(self) -> None:
        """Switch to training mode (e.g. filters update their statistics)."""
        self.is_training = True

    def in_eval(self) -> None:
        """Switch to evaluation mode (e.g. filters freeze their statistics)."""
        self.is_training = False

    def reset(self, env_id: int) -> None:
        """Forget per-env state of ``env_id``; built-ins keep state per trajectory key instead."""

    def params(self) -> dict[str, Any]:
        """Keyword arguments (JSON-serialisable) that rebuild this connector."""
        return {}

    @classmethod
    def registry_name(cls) -> str:
        """Name this class is registered under, else its ``module:Class`` import path."""
        return cls.__dict__.get("_registry_name") or f"{cls.__module__}:{cls.__qualname__}"

    def to_state(self) -> tuple[str, dict[str, Any]]:
        """``(name, params)`` that ``connectors.get_connector`` turns back into this connector."""
        return self.registry_name(), self.params()

    @classmethod
    def from_state(cls, ctx: ConnectorContext, params: dict[str, Any]) -> Self:
        """Rebuild a connector from the params of ``to_state``."""
        return cls(ctx, **params)

    def can_update_from(self, params: Mapping[str, Any]) -> bool:
        """Whether ``update_from(params)`` can take ``params`` over in place.

        In place means keeping what the connector holds per live trajectory
        (RNN states, previous actions, stacked frames) and its train/eval
        mode; ``ConnectorPipeline.set_state`` rebuilds a connector only when
        this is False. Default: True when ``params`` (missing ones taken as
        the constructor's defaults) equal ``self.params()``, i.e. there is
        nothing to take over. Connectors with learned state (filter
        statistics) override this and ``update_from``. Never changes ``self``.
        """
        try:
            return _with_defaults(type(self), params) == self.params()
        except (ConnectorError, TypeError, ValueError):
            return False

    def update_from(self, params: Mapping[str, Any]) -> None:
        """Take ``params`` over in place; only called when ``can_update_from(params)``."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


def _with_defaults(cls: type[Connector], params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` completed with the constructor defaults of ``cls`` (for comparisons)."""
    full = dict(params)
    for name, parameter in inspect.signature(cls).parameters.items():
        if name == "ctx" or name in full or parameter.default is inspect.Parameter.empty:
            continue
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            full[name] = parameter.default
    return full


class AgentConnector(Connector):
    """Transforms one policy's rows of one round (may change, add or drop rows).

    Override ``transform`` for a per-item connector (it sees one
    ``AgentConnectorDataType`` at a time, with the keys of docs/CONNECTORS.md ``t, env_id,
    agent_index, rewards, terminateds, truncateds, infos, new_obs``), or
    ``__call__`` to work on whole columns (``AgentRows``, obs in ``"obs"``). A connector that changes the observation declares it in
    ``output_observation_space`` so a pipeline is checked when it is built.
    """

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._input_space: gym.Space | None = None

    @property
    def input_observation_space(self) -> gym.Space:
        """The space this connector receives: set by its pipeline, else the env's."""
        return self.ctx.observation_space if self._input_space is None else self._input_space

    def bind_input_space(self, space: gym.Space) -> gym.Space:
        """Fix the input space (the pipeline calls this) and return the output space.

        Raises ``ConnectorError`` when the connector cannot take ``space``.
        Connectors that precompute work for their input space override this.
        """
        out = self.output_observation_space(space)
        self._input_space = space
        return out

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        """The observation space this connector outputs for input ``space``."""
        return space

    def __call__(self, rows: AgentRows) -> AgentRows:
        """Batch path; by default runs ``transform`` on each row."""
        out: list[AgentConnectorDataType] = []
        for item in rows.to_items():
            result = self.transform(item)
            if isinstance(result, AgentConnectorDataType):
                out.append(result)
            else:
                out.extend(result)
        return AgentRows.from_items(out, like=rows)

    def transform(
        self, item: AgentConnectorDataType
    ) -> AgentConnectorDataType | list[AgentConnectorDataType]:
        """Per-item path: return the item (changed or not), or a list to drop/add items."""
        raise NotImplementedError(f"{type(self).__name__} must override transform() or __call__()")

    def on_policy_output(self, output: ActionRows) -> None:
        """Hear the policy's raw output for the rows it evaluated (RNN state, previous action)."""


class ActionConnector(Connector):
    """Transforms a policy's output for the env; changes ``actions`` only.

    Returns a new ``ActionRows`` rather than changing the given one, so the
    runner still holds the raw policy actions for the trajectory. A connector
    that changes the action space declares it in ``input_action_space``: the
    pipeline folds the chain back from the env's action space to the policy's
    (the space the policy acts in), checked when the pipeline is built.
    """

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._output_space: gym.Space | None = None

    @property
    def output_action_space(self) -> gym.Space:
        """The space this connector's output must fit: set by its pipeline, else the env's."""
        return self.ctx.action_space if self._output_space is None else self._output_space

    def bind_output_space(self, space: gym.Space) -> gym.Space:
        """Fix the output space (the pipeline calls this) and return the space taken.

        Raises ``ConnectorError`` when the connector cannot output ``space``.
        Connectors that precompute work for their output space override this.
        """
        taken = self.input_action_space(space)
        self._output_space = space
        return taken

    def input_action_space(self, space: gym.Space) -> gym.Space:
        """The action space this connector takes when its output goes into ``space``."""
        return space

    def __call__(self, out: ActionRows) -> ActionRows:
        """Batch path; by default runs ``transform`` on each row."""
        return ActionRows.from_items([self.transform(item) for item in out.to_items()], like=out)

    def transform(self, item: ActionConnectorDataType) -> ActionConnectorDataType:
        """Per-item path: return the item with its ``output`` changed (one item per row)."""
        raise NotImplementedError(f"{type(self).__name__} must override transform() or __call__()")
