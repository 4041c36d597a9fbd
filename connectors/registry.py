"""Connector names -> classes, and connectors from config spec lists.

Every built-in (``BUILTIN_CONNECTORS``: what ``connectors.agent`` and
``connectors.action`` export) is registered under its class name. A spec list (as written
in YAML) holds names or ``{name: ..., <param>: ...}`` mappings; a name may
also be a ``"package.module:Class"`` import path of a user connector.
Pipelines are built from these lists in ``connectors.pipeline``, which
imports this module (never the other way round).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import connectors.action as builtin_action
import connectors.agent as builtin_agent
from connectors.action import (
    ClipActionsConnector,
    ConvertToNumpyConnector,
    LambdaActionConnector,
    NormalizeActionsConnector,
)
from connectors.agent import (
    LambdaAgentConnector,
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
from connectors.imports import ImportPathError, import_object
from connectors.params import annotation, constructor_parameters, describe_type, fits, suggest

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


def connector_class(name: str) -> type[Connector]:
    """The class registered as ``name``, or at import path ``name`` (``pkg.mod:Class``)."""
    cls = _REGISTRY.get(name)
    if cls is None and ":" in name:
        try:
            cls = import_object(name)
        except ImportPathError as err:
            raise ConnectorError(f"connector {name!r}: {err}") from None
        if not (isinstance(cls, type) and issubclass(cls, Connector)):
            raise ConnectorError(f"{name!r} is not a Connector subclass but {cls!r}")
    if cls is None:
        raise ConnectorError(
            f"unknown connector {name!r}{suggest(name, _REGISTRY)}; registered: "
            f"{', '.join(registered_names())} (or give a 'package.module:Class' import path)"
        )
    return cls


def kind_of(cls: type[Connector]) -> Kind:
    """``"agent"`` or ``"action"``: which pipeline a connector class belongs in."""
    for kind, base in _KIND_TYPES.items():
        if issubclass(cls, base):
            return kind  # type: ignore[return-value]
    raise ConnectorError(
        f"{cls.__name__} is neither an AgentConnector nor an ActionConnector subclass"
    )


def check_params(name: str, cls: type[Connector], params: Mapping[str, Any]) -> None:
    """Checks parameter names (and simple annotated types) against ``cls``'s constructor.

    Lets a config be checked without building anything. Classes that
    override ``from_state`` or take ``**kwargs`` decide themselves which
    parameters they take, so only their types are checked.
    """
    if not isinstance(params, Mapping):
        raise ConnectorError(f"params of connector {name!r} must be a mapping, got {params!r}")
    parameters = constructor_parameters(cls)
    takes_any = overrides_from_state(cls) or any(
        p.kind is p.VAR_KEYWORD for p in parameters.values()
    )
    for param, value in params.items():
        if param not in parameters:
            if takes_any:
                continue
            accepted = [p for p, spec in parameters.items() if spec.kind is not spec.VAR_POSITIONAL]
            raise ConnectorError(
                f"{name}: unknown parameter {param!r}{suggest(param, accepted)}; "
                f"it accepts {', '.join(map(repr, accepted)) or 'no parameters'}",
                param=param,
            )
        expected = annotation(cls, param)
        if expected is not None and not fits(value, expected):
            raise ConnectorError(
                f"{name}: parameter {param!r} got {value!r}, expected {describe_type(expected)}",
                param=param,
            )


def overrides_from_state(cls: type[Connector]) -> bool:
    """Whether ``cls`` (or a base below ``Connector``) defines its own ``from_state``.

    Read from the class dicts, not the attribute, because ``from_state`` may be
    a classmethod, a staticmethod or a plain function and only the first has
    a ``__func__`` to compare.
    """
    for klass in cls.__mro__:
        if "from_state" in vars(klass):
            return klass is not Connector
    return False


def get_connector(
    name: str, ctx: ConnectorContext, params: Mapping[str, Any] | None = None
) -> Connector:
    """Build the connector registered as ``name`` (or at import path ``name``) with ``params``.

    A ``ConnectorError`` about one parameter has ``.param`` set to its name.
    """
    cls = connector_class(name)
    params = {} if params is None else params
    check_params(name, cls, params)
    try:
        return cls.from_state(ctx, dict(params))
    except ConnectorError:
        raise
    except (TypeError, ValueError) as err:
        accepted = list(constructor_parameters(cls))
        raise ConnectorError(
            f"cannot build connector {name!r} with params {dict(params)!r}: {err} "
            f"(it accepts {accepted or 'no params'})"
        ) from None


def parse_spec(item: Any, position: int, kind: str = "") -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of one spec-list item: a name, ``{name: ..., **params}`` or a pair."""
    if isinstance(item, str):
        return item.strip(), {}
    if isinstance(item, Mapping) and isinstance(item.get("name"), str):
        return item["name"].strip(), {k: v for k, v in item.items() if k != "name"}
    if (
        isinstance(item, (list, tuple))
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], Mapping)
    ):
        return item[0], dict(item[1])
    raise ConnectorError(
        f"{kind + ' ' if kind else ''}connector spec #{position} is {item!r}: expected a "
        "connector name, a mapping like {name: ClipRewardAgentConnector, limit: 1.0}, "
        "or a (name, params) pair",
        index=position,
    )


def check_spec_list(
    spec_list: Sequence[Any], kind: Kind | None = None, *, import_paths: bool = True
) -> Kind | None:
    """Checks a spec list without building it (no spaces needed); returns its kind.

    Checks each item's shape, that its connector exists, its parameter names
    and simple types, and that every item is of one kind (``kind`` when
    given). ``import_paths=False`` skips ``module:Class`` items (their code may
    not be importable where a config is edited). Errors carry ``.index`` and
    ``.param``. Returns None for a list whose kind cannot be told.
    """
    _check_list(spec_list, kind)
    first: tuple[int, str, Kind] | None = None
    for position, item in enumerate(spec_list):
        if isinstance(item, Connector):
            cls, name = type(item), type(item).__name__
        else:
            name, params = parse_spec(item, position, kind or "")
            if ":" in name and not import_paths:
                continue
            try:
                cls = connector_class(name)
                check_params(name, cls, params)
            except ConnectorError as err:
                raise err.at(position, f"{_where(kind, position)}: ") from None
        first = _check_kind(kind, first, position, name, cls)
    return kind or (None if first is None else first[2])


def build_connectors(
    spec_list: Sequence[Any], ctx: ConnectorContext, kind: Kind | None = None
) -> list[Connector]:
    """Connectors from a spec list; items may also be ready-made connectors.

    ``kind`` (``"agent"`` / ``"action"``) is optional: the kind is read from
    the connector classes, and a list mixing kinds is an error naming the
    item. Errors carry ``.index`` (the item's position) and ``.param``.
    """
    _check_list(spec_list, kind)
    connectors: list[Connector] = []
    first: tuple[int, str, Kind] | None = None
    for position, item in enumerate(spec_list):
        if isinstance(item, Connector):
            connector, name = item, type(item).__name__
        else:
            name, params = parse_spec(item, position, kind or "")
            try:
                connector = get_connector(name, ctx, params)
            except ConnectorError as err:
                raise err.at(position, f"{_where(kind, position)}: ") from None
        first = _check_kind(kind, first, position, name, type(connector))
        connectors.append(connector)
    return connectors


def _check_list(spec_list: Any, kind: Kind | None) -> None:
    if kind is not None and kind not in _KIND_TYPES:
        raise ConnectorError(f"kind must be 'agent' or 'action', got {kind!r}")
    if isinstance(spec_list, (str, Mapping)) or not isinstance(spec_list, Sequence):
        raise ConnectorError(
            f"{kind + ' ' if kind else ''}connectors must be given as a list, got {spec_list!r}"
        )


def _where(kind: Kind | None, position: int) -> str:
    return f"{kind + ' ' if kind else ''}connector spec #{position}"


def _check_kind(
    kind: Kind | None,
    first: tuple[int, str, Kind] | None,
    position: int,
    name: str,
    cls: type[Connector],
) -> tuple[int, str, Kind]:
    """Raises unless ``cls`` is of ``kind`` (or of the first item's kind); returns the first item."""
    this_kind = kind_of(cls)
    if kind is not None and this_kind != kind:
        raise ConnectorError(
            f"{kind} connector spec #{position} is {name}, an {this_kind} connector, not an "
            f"{_KIND_TYPES[kind].__name__}: it belongs in the {this_kind} chain",
            index=position,
        )
    if first is None:
        return (position, name, this_kind)
    first_position, first_name, first_kind = first
    if this_kind != first_kind:
        raise ConnectorError(
            f"connector spec #{position} is {name}, an {this_kind} connector, but spec "
            f"#{first_position} ({first_name}) is an {first_kind} connector: one list holds one kind",
            index=position,
        )
    return first


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


#: Every built-in connector: the Connector classes the built-in packages export
#: (``connectors.agent`` and ``connectors.action``, also exported by ``connectors``).
BUILTIN_CONNECTORS: tuple[type[Connector], ...] = tuple(
    obj
    for package in (builtin_agent, builtin_action)
    for obj in (getattr(package, name) for name in package.__all__)
    if isinstance(obj, type) and issubclass(obj, Connector)
)

for _builtin in BUILTIN_CONNECTORS:
    register_connector(_builtin.__name__, _builtin)
