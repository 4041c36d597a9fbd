"""Connector names -> classes, and pipelines from config spec lists.

Every built-in is registered under its class name. A spec list (as written
in YAML) holds names or ``{name: ..., <param>: ...}`` mappings; a name may
also be a ``"package.module:Class"`` import path of a user connector.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from connectors.action import (
    ClipActionsConnector,
    ConvertToNumpyConnector,
    ImmutableActionsConnector,
    LambdaActionConnector,
    NormalizeActionsConnector,
)
from connectors.agent import (
    ClipRewardAgentConnector,
    FlattenDataAgentConnector,
    LambdaAgentConnector,
    MeanStdObservationFilterAgentConnector,
    ObsPreprocessorConnector,
    StateBufferConnector,
    ViewRequirementAgentConnector,
)
from connectors.base import (
    ActionConnector,
    AgentConnector,
    Connector,
    ConnectorContext,
)
from connectors.data import ActionConnectorDataType, AgentConnectorDataType
from connectors.errors import ConnectorError
from connectors.imports import import_object
from connectors.pipeline import ActionConnectorPipeline, AgentConnectorPipeline

Kind = Literal["agent", "action"]

_REGISTRY: dict[str, type[Connector]] = {}
_KIND_TYPES: dict[str, type[Connector]] = {"agent": AgentConnector, "action": ActionConnector}


def register_connector(name: str, cls: type[Connector]) -> None:
    """Make ``cls`` buildable as ``name`` (re-registering a name replaces it)."""
    if not isinstance(name, str) or not name:
        raise ConnectorError(f"a connector name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Connector)):
        raise ConnectorError(f"connector {name!r} must be a Connector subclass, got {cls!r}")
    replaced = _REGISTRY.get(name)
    if replaced is not None and replaced.__dict__.get("_registry_name") == name:
        del replaced._registry_name  # its instances now serialise by import path
    _REGISTRY[name] = cls
    cls._registry_name = name  # type: ignore[attr-defined]


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def _resolve(name: str) -> type[Connector]:
    cls = _REGISTRY.get(name)
    if cls is None and ":" in name:
        cls = import_object(name)
        if not (isinstance(cls, type) and issubclass(cls, Connector)):
            raise ConnectorError(f"{name!r} is not a Connector subclass but {cls!r}")
    if cls is None:
        raise ConnectorError(
            f"unknown connector {name!r}; registered: {', '.join(registered_names())} "
            "(or give a 'package.module:Class' import path)"
        )
    return cls


def get_connector(
    name: str, ctx: ConnectorContext, params: Mapping[str, Any] | None = None
) -> Connector:
    """Build the connector registered as ``name`` (or at import path ``name``) with ``params``."""
    cls = _resolve(name)
    if params is not None and not isinstance(params, Mapping):
        raise ConnectorError(f"params of connector {name!r} must be a mapping, got {params!r}")
    params = dict(params or {})
    try:
        return cls.from_state(ctx, params)
    except TypeError as err:
        accepted = [p for p in inspect.signature(cls).parameters if p != "ctx"]
        raise ConnectorError(
            f"cannot build connector {name!r} with params {params!r}: {err} "
            f"(it accepts {accepted or 'no params'})"
        ) from None


def parse_spec(item: Any, position: int, kind: str) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of one spec-list item: a name, ``{name: ..., **params}`` or a pair."""
    if isinstance(item, str):
        return item, {}
    if isinstance(item, Mapping) and isinstance(item.get("name"), str):
        return item["name"], {k: v for k, v in item.items() if k != "name"}
    if (
        isinstance(item, (list, tuple))
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], Mapping)
    ):
        return item[0], dict(item[1])
    raise ConnectorError(
        f"{kind} connector spec #{position} is {item!r}: expected a connector name, "
        "a mapping like {name: ClipRewardAgentConnector, limit: 1.0}, or a (name, params) pair"
    )


def build_connectors(
    spec_list: Sequence[Any], ctx: ConnectorContext, kind: Kind = "agent"
) -> list[Connector]:
    """Connectors from a spec list; items may also be ready-made connectors."""
    if kind not in _KIND_TYPES:
        raise ConnectorError(f"kind must be 'agent' or 'action', got {kind!r}")
    if isinstance(spec_list, (str, Mapping)) or not isinstance(spec_list, Sequence):
        raise ConnectorError(f"{kind} connectors must be given as a list, got {spec_list!r}")
    expected = _KIND_TYPES[kind]
    connectors = []
    for position, item in enumerate(spec_list):
        if isinstance(item, Connector):
            connector = item
        else:
            name, params = parse_spec(item, position, kind)
            try:
                connector = get_connector(name, ctx, params)
            except ConnectorError as err:
                raise ConnectorError(f"{kind} connector spec #{position}: {err}") from None
        if not isinstance(connector, expected):
            raise ConnectorError(
                f"{kind} connector spec #{position} is {type(connector).__name__}, "
                f"not an {expected.__name__}"
            )
        connectors.append(connector)
    return connectors


def build_pipeline(
    spec_list: Sequence[Any] | None, ctx: ConnectorContext, kind: Kind = "agent"
) -> AgentConnectorPipeline | ActionConnectorPipeline:
    """A pipeline from a config spec list; ``None`` gives the default chain, ``[]`` an empty one."""
    if kind not in _KIND_TYPES:
        raise ConnectorError(f"kind must be 'agent' or 'action', got {kind!r}")
    if spec_list is not None:
        connectors = build_connectors(spec_list, ctx, kind)
    elif kind == "agent":
        connectors = default_agent_connectors(ctx)
    else:
        connectors = default_action_connectors(ctx)
    pipeline_cls = AgentConnectorPipeline if kind == "agent" else ActionConnectorPipeline
    return pipeline_cls(ctx, connectors)


def default_agent_connectors(ctx: ConnectorContext) -> list[AgentConnector]:
    """Preprocess observations, then add RNN state and view requirements (both no-ops if unused)."""
    return [
        ObsPreprocessorConnector(ctx),
        StateBufferConnector(ctx),
        ViewRequirementAgentConnector(ctx),
    ]


def default_action_connectors(ctx: ConnectorContext) -> list[ActionConnector]:
    """To numpy, then unsquash Box actions if ``ctx.config["normalize_actions"]``, else clip them."""
    fit = NormalizeActionsConnector if ctx.config.get("normalize_actions") else ClipActionsConnector
    return [ConvertToNumpyConnector(ctx), fit(ctx)]


def register_lambda_agent_connector(
    name: str,
    fn: Callable[[AgentConnectorDataType], AgentConnectorDataType | list[AgentConnectorDataType]],
) -> type[LambdaAgentConnector]:
    """Register a per-item function as agent connector ``name`` (serialisable by that name)."""
    return _register_function(name, LambdaAgentConnector, fn)


def register_lambda_action_connector(
    name: str, fn: Callable[[ActionConnectorDataType], ActionConnectorDataType]
) -> type[LambdaActionConnector]:
    """Register a per-item function as action connector ``name`` (serialisable by that name)."""
    return _register_function(name, LambdaActionConnector, fn)


def _register_function(name: str, base: type, fn: Callable[[Any], Any]) -> type:
    """A subclass of ``base`` bound to ``fn``, saved by its registered name (no params)."""

    class Registered(base):
        def __init__(self, ctx: ConnectorContext) -> None:
            super().__init__(ctx, fn)

        def params(self) -> dict[str, Any]:
            return {}

    Registered.__name__ = Registered.__qualname__ = name
    register_connector(name, Registered)
    return Registered


for _builtin in (
    ObsPreprocessorConnector,
    FlattenDataAgentConnector,
    ClipRewardAgentConnector,
    MeanStdObservationFilterAgentConnector,
    StateBufferConnector,
    ViewRequirementAgentConnector,
    LambdaAgentConnector,
    ConvertToNumpyConnector,
    NormalizeActionsConnector,
    ClipActionsConnector,
    ImmutableActionsConnector,
    LambdaActionConnector,
):
    register_connector(_builtin.__name__, _builtin)
