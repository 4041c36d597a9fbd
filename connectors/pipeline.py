"""Chains of connectors, checked when built and timed when run; `build_pipeline` makes one
from a config spec list."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar, overload

import gymnasium as gym

from connectors.base import ActionConnector, AgentConnector, Connector, ConnectorContext
from connectors.data import ActionConnectorDataType, ActionRows, AgentConnectorDataType, AgentRows
from connectors.errors import ConnectorError
from connectors.registry import (
    Kind,
    build_connectors,
    default_action_connectors,
    default_agent_connectors,
    get_connector,
    kind_of,
    parse_spec,
)

if TYPE_CHECKING:
    from typing_extensions import Self

C = TypeVar("C", bound=Connector)
Key = str | type


class ConnectorTiming(NamedTuple):
    """Time one connector spent in a pipeline since the last ``pop_timings``."""

    seconds: float
    calls: int

    @property
    def mean_ms(self) -> float:
        """Milliseconds per call."""
        return 1000.0 * self.seconds / self.calls if self.calls else 0.0

    def to_dict(self) -> dict[str, float | int]:
        """``{"mean_ms", "total_ms", "calls"}``: plain, JSON-ready numbers."""
        return {"mean_ms": self.mean_ms, "total_ms": 1000.0 * self.seconds, "calls": self.calls}


def _names(connector: Connector) -> tuple[str, str]:
    return type(connector).__name__, connector.registry_name()


def _timer_names(chain: Sequence[Connector]) -> list[str]:
    """Class names, with ``#2``, ``#3`` ... for repeats, so each connector is timed apart."""
    seen: dict[str, int] = {}
    names = []
    for connector in chain:
        base = type(connector).__name__
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return names


class ConnectorPipeline(Generic[C]):
    """An ordered chain of connectors, run one after the other on each call.

    Connectors are found by index, by class name / registered name, or by
    class (``isinstance``, first match). A name or class that is not in the
    chain raises ``KeyError`` listing what is there; a chain that does not
    fit together raises ``ConnectorError`` and leaves the pipeline unchanged.
    """

    connector_type: ClassVar[type[Connector]] = Connector
    kind: ClassVar[str] = "connector"

    def __init__(self, ctx: ConnectorContext, connectors: Iterable[C] = ()) -> None:
        self.ctx = ctx
        self.is_training = True
        self._connectors: list[C] = []
        self._timers: dict[str, list[float]] = {}
        self._slots: list[list[float]] = []
        self._set_chain(list(connectors))

    # --- the chain ---------------------------------------------------------

    def _set_chain(self, chain: list[C]) -> None:
        for position, connector in enumerate(chain):
            if not isinstance(connector, self.connector_type):
                raise ConnectorError(
                    f"{type(self).__name__} takes {self.connector_type.__name__}s; "
                    f"item {position} is {connector!r}"
                )
        self._check(chain)
        for connector in chain:
            if self.is_training:
                connector.in_training()
            else:
                connector.in_eval()
        self._connectors = chain
        # Timers are shared by name, so one dict lookup per chain edit, none per call.
        self._slots = [self._timers.setdefault(name, [0.0, 0]) for name in _timer_names(chain)]

    def _check(self, chain: list[C]) -> None:
        """Validate a candidate chain (agent pipelines check spaces)."""

    def _index(self, key: Key) -> int:
        for i, connector in enumerate(self._connectors):
            if isinstance(key, str):
                if key in _names(connector):
                    return i
            elif isinstance(key, type):
                if isinstance(connector, key):
                    return i
            else:
                raise TypeError(f"look connectors up by name or class, not {key!r}")
        wanted = key if isinstance(key, str) else key.__name__
        names = [type(c).__name__ for c in self._connectors]
        raise KeyError(f"no connector {wanted!r} in {type(self).__name__}; it has {names}")

    def append(self, connector: C) -> None:
        """Adds a connector at the end; the chain is checked first."""
        self._set_chain([*self._connectors, connector])

    def prepend(self, connector: C) -> None:
        """Adds a connector at the front; the chain is checked first."""
        self._set_chain([connector, *self._connectors])

    def insert_before(self, name_or_cls: Key, connector: C) -> None:
        """Adds a connector before the first match of ``name_or_cls``."""
        i = self._index(name_or_cls)
        self._set_chain([*self._connectors[:i], connector, *self._connectors[i:]])

    def insert_after(self, name_or_cls: Key, connector: C) -> None:
        """Adds a connector after the first match of ``name_or_cls``."""
        i = self._index(name_or_cls) + 1
        self._set_chain([*self._connectors[:i], connector, *self._connectors[i:]])

    def remove(self, name_or_cls: Key) -> C:
        """Take the first matching connector out of the chain and return it."""
        i = self._index(name_or_cls)
        removed = self._connectors[i]
        self._set_chain([*self._connectors[:i], *self._connectors[i + 1 :]])
        return removed

    @overload
    def __getitem__(self, key: int) -> C: ...
    @overload
    def __getitem__(self, key: slice) -> list[C]: ...
    @overload
    def __getitem__(self, key: Key) -> C: ...
    def __getitem__(self, key: int | slice | Key) -> C | list[C]:
        if isinstance(key, (int, slice)):
            return self._connectors[key]
        return self._connectors[self._index(key)]

    def __contains__(self, key: object) -> bool:
        try:
            self._index(key)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def __len__(self) -> int:
        return len(self._connectors)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._connectors))

    def __repr__(self) -> str:
        if not self._connectors:
            return f"{type(self).__name__}([])"
        inner = ",\n".join(f"  {c!r}" for c in self._connectors)
        return f"{type(self).__name__}([\n{inner},\n])"

    # --- running -----------------------------------------------------------

    def _run(self, data: Any) -> Any:
        clock = time.perf_counter
        start = clock()
        for connector, slot in zip(self._connectors, self._slots):
            data = connector(data)
            now = clock()
            slot[0] += now - start
            slot[1] += 1
            start = now
        return data

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent per connector name since the last ``pop_timings``."""
        return {name: slot[0] for name, slot in self._timers.items() if slot[1]}

    def pop_timing_records(self) -> dict[str, ConnectorTiming]:
        """Time and call count per connector name since the last pop; resets them."""
        out = {}
        for name, slot in self._timers.items():
            if slot[1]:
                out[name] = ConnectorTiming(slot[0], int(slot[1]))
                slot[0], slot[1] = 0.0, 0
        return out

    def pop_timings(self) -> dict[str, dict[str, float | int]]:
        """``{name: {"mean_ms", "total_ms", "calls"}}`` since the last pop; resets them.

        Plain numbers, so the runner's ``connector_metrics`` is JSON-ready.
        ``mean_ms`` is per call, i.e. per runner round in which the policy
        had rows. Names are class names; a class that occurs again in the
        chain is timed as ``Name#2``, ``Name#3`` ...
        """
        return {name: timing.to_dict() for name, timing in self.pop_timing_records().items()}

    def reset(self, env_id: int) -> None:
        """The sub-env is reset: every connector forgets its per-trajectory state there."""
        for connector in self._connectors:
            connector.reset(env_id)

    def in_training(self) -> None:
        """Training mode: stateful connectors (e.g. filters) update their statistics."""
        self.is_training = True
        for connector in self._connectors:
            connector.in_training()

    def in_eval(self) -> None:
        """Evaluation mode: stateful connectors use, but do not update, their statistics."""
        self.is_training = False
        for connector in self._connectors:
            connector.in_eval()

    # --- state -------------------------------------------------------------

    def to_state(self) -> list[tuple[str, dict[str, Any]]]:
        """``[(name, params), ...]``, JSON-serialisable; ``from_state`` rebuilds the chain."""
        return [connector.to_state() for connector in self._connectors]

    @classmethod
    def from_state(cls, ctx: ConnectorContext, state: Sequence[Any]) -> Self:
        """A new pipeline from ``to_state``'s result."""
        return cls(ctx, build_connectors(state, ctx, kind=cls.kind))  # type: ignore[arg-type]

    def set_state(self, state: Sequence[Any]) -> None:
        """Take ``state`` (from ``to_state``) over in place, keeping what can be kept.

        Where ``state`` names the same connectors in the same order, each
        connector takes its params over in place (``can_update_from`` /
        ``update_from``: filter statistics are replaced) and keeps its
        per-trajectory state (RNN states, previous actions, stacked frames),
        so syncing a runner between samples does not cut its running
        episodes; a connector whose other params differ is rebuilt. Any other
        ``state`` rebuilds the whole chain. Either way the pipeline object,
        its train/eval mode and its timers stay. If building fails nothing
        changes.
        """
        if isinstance(state, (str, Mapping)) or not isinstance(state, Sequence):
            raise ConnectorError(f"{type(self).__name__} state must be a list, got {state!r}")
        parsed = [
            None if isinstance(item, Connector) else parse_spec(item, i, self.kind)
            for i, item in enumerate(state)
        ]
        same_chain = len(parsed) == len(self._connectors) and all(
            spec is not None and spec[0] in _names(connector)
            for spec, connector in zip(parsed, self._connectors)
        )
        if not same_chain:
            self._set_chain(build_connectors(state, self.ctx, kind=self.kind))  # type: ignore[arg-type]
            return
        keep = [c.can_update_from(params) for c, (_, params) in zip(self._connectors, parsed)]
        chain = list(self._connectors)
        for i, ((name, params), kept) in enumerate(zip(parsed, keep)):
            if not kept:
                try:
                    chain[i] = get_connector(name, self.ctx, params)  # type: ignore[assignment]
                except ConnectorError as err:
                    raise ConnectorError(f"{self.kind} connector state #{i}: {err}") from None
        if any(not kept for kept in keep):
            self._set_chain(chain)  # checks the new chain before anything changes
        for connector, (_, params), kept in zip(chain, parsed, keep):
            if kept:
                connector.update_from(params)


class AgentConnectorPipeline(ConnectorPipeline[AgentConnector]):
    """Runs agent connectors on one policy's ``AgentRows`` of a round.

    ``output_observation_space`` is the policy's input space: each
    connector's ``output_observation_space`` folded over the env's space,
    recomputed on every chain change.
    """

    connector_type = AgentConnector
    kind = "agent"

    def __init__(self, ctx: ConnectorContext, connectors: Iterable[AgentConnector] = ()) -> None:
        self.output_observation_space: gym.Space = ctx.observation_space
        super().__init__(ctx, connectors)

    def _fold_spaces(self, chain: Sequence[AgentConnector]) -> gym.Space:
        space = self.ctx.observation_space
        source = "its input is the env's observation space"
        for position, connector in enumerate(chain):
            try:
                out = connector.bind_input_space(space)
            except ConnectorError as err:
                raise ConnectorError(
                    f"{type(self).__name__}: {err} ({source})", index=position, param=err.param
                ) from None
            source = f"its input comes from {type(connector).__name__}"
            space = out
        return space

    def _check(self, chain: list[AgentConnector]) -> None:
        try:
            self.output_observation_space = self._fold_spaces(chain)
        except ConnectorError:
            self._fold_spaces(self._connectors)  # re-bind the unchanged chain as it was
            raise

    def refresh_spaces(self) -> None:
        """Re-derive the spaces, e.g. after ``ctx.view_requirements`` changed."""
        self.output_observation_space = self._fold_spaces(self._connectors)

    @overload
    def __call__(self, rows: AgentRows) -> AgentRows: ...
    @overload
    def __call__(self, rows: list[AgentConnectorDataType]) -> list[AgentConnectorDataType]: ...
    def __call__(
        self, rows: AgentRows | list[AgentConnectorDataType]
    ) -> AgentRows | list[AgentConnectorDataType]:
        """Runs the chain on one round's rows, or on items (and returns items)."""
        if isinstance(rows, AgentRows):
            return self._run(rows)
        return self._run(AgentRows.from_items(rows)).to_items()

    def on_policy_output(self, output: ActionRows) -> None:
        """Tell every connector what the policy did (RNN state, previous actions)."""
        for connector in self._connectors:
            connector.on_policy_output(output)


class ActionConnectorPipeline(ConnectorPipeline[ActionConnector]):
    """Runs action connectors on a policy's ``ActionRows``; actions only change.

    ``input_action_space`` is the policy's action space: each connector's
    ``input_action_space`` folded back from the env's action space (the last
    connector's output), recomputed on every chain change.
    """

    connector_type = ActionConnector
    kind = "action"

    def __init__(self, ctx: ConnectorContext, connectors: Iterable[ActionConnector] = ()) -> None:
        self.input_action_space: gym.Space = ctx.action_space
        super().__init__(ctx, connectors)

    def _fold_spaces(self, chain: Sequence[ActionConnector]) -> gym.Space:
        space = self.ctx.action_space
        target = "its output goes to the env's action space"
        for position in reversed(range(len(chain))):
            connector = chain[position]
            try:
                space = connector.bind_output_space(space)
            except ConnectorError as err:
                raise ConnectorError(
                    f"{type(self).__name__}: {err} ({target})", index=position, param=err.param
                ) from None
            target = f"its output goes to {type(connector).__name__}"
        return space

    def _check(self, chain: list[ActionConnector]) -> None:
        try:
            self.input_action_space = self._fold_spaces(chain)
        except ConnectorError:
            self._fold_spaces(self._connectors)  # re-bind the unchanged chain as it was
            raise

    @overload
    def __call__(self, output: ActionRows) -> ActionRows: ...
    @overload
    def __call__(self, output: ActionConnectorDataType) -> ActionConnectorDataType: ...
    def __call__(
        self, output: ActionRows | ActionConnectorDataType
    ) -> ActionRows | ActionConnectorDataType:
        """Runs the chain on a policy's output rows, or on one item (and returns an item)."""
        if isinstance(output, ActionRows):
            return self._run(output)
        return self._run(ActionRows.of_item(output)).to_items()[0]


def build_pipeline(
    spec_list: Sequence[Any] | None, ctx: ConnectorContext, kind: Kind | None = None
) -> AgentConnectorPipeline | ActionConnectorPipeline:
    """A pipeline from a config spec list; its kind is read from the connectors in it.

    ``None`` gives the default chain of ``kind`` (which must then be given),
    ``[]`` an empty pipeline of ``kind`` (agent when not given). ``kind``, when
    given, is checked against every item.
    """
    if kind is not None and kind not in ("agent", "action"):
        raise ConnectorError(f"kind must be 'agent' or 'action', got {kind!r}")
    if spec_list is None:
        if kind is None:
            raise ConnectorError(
                "build_pipeline(None, ctx) means the default chain: say which one with "
                "kind='agent' or kind='action'"
            )
        connectors: list[Connector] = (
            default_agent_connectors(ctx) if kind == "agent" else default_action_connectors(ctx)
        )
    else:
        connectors = build_connectors(spec_list, ctx, kind)
        if kind is None:
            kind = kind_of(type(connectors[0])) if connectors else "agent"
    pipeline_cls = AgentConnectorPipeline if kind == "agent" else ActionConnectorPipeline
    return pipeline_cls(ctx, connectors)  # type: ignore[arg-type]
