"""Data that travels through connector pipelines.

The runner never builds per-agent objects on its hot path: one policy's rows
of one round travel as columns (``AgentRows``), and the policy's output for
them as ``ActionRows``. The per-item types exist so that a user connector can
be written against one row at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import tree

from connectors.errors import ConnectorError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from typing_extensions import Self

#: THE bookkeeping columns: the runner fills them in and reads them back; connectors
#: that transform data columns (e.g. flattening) leave them alone.
META_COLUMNS = frozenset(
    {"infos", "env_ids", "agent_ids", "agent_index", "t", "keys", "is_first"}
)

#: Columns the per-item view hides: they travel on the item (``bookkeeping``) so that
#: a row survives the round trip through a per-item connector.
_HIDDEN_COLUMNS = ("keys", "is_first")

#: Column name -> key in the per-item view (the names docs/CONNECTORS.md gives); other columns keep theirs.
#: ``agent_ids`` is the item's ``agent_id`` field; ``env_ids`` also is its ``env_id`` field.
_ITEM_KEYS = {"obs": "new_obs", "env_ids": "env_id"}
_COLUMN_NAMES = {key: column for column, key in _ITEM_KEYS.items()}


@dataclass
class AgentConnectorDataType:
    """One agent's row as a per-item connector sees it.

    ``data`` holds the keys ``t, env_id, agent_index, rewards, terminateds,
    truncateds, infos, new_obs`` (``new_obs`` is the observation just
    received; ``t`` its index in the agent's episode, 0 on the first) plus
    any column an earlier connector added (``action_mask``, ``state_in_0``,
    ``prev_actions`` ...). To move a row to another env or agent change the
    ``env_id`` / ``agent_id`` fields (``data["env_id"]`` is a read-only copy).
    ``bookkeeping`` is the runner's (trajectory key, first-row flag): copy an
    item (``copy.deepcopy``) to add a row, never fill it by hand.
    """

    env_id: int
    agent_id: Any
    data: dict[str, Any]
    bookkeeping: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass
class ActionConnectorDataType:
    """One row of policy output: ``output`` is ``(action, state_outs, extra)``."""

    env_id: int
    agent_id: Any
    input_dict: dict[str, Any]
    output: tuple[Any, list[Any], dict[str, Any]]


class AgentConnectorsOutput(NamedTuple):
    """An agent's data before (``raw_dict``) and after (``sample_batch``) its agent connectors."""

    raw_dict: dict[str, Any]
    sample_batch: dict[str, Any]


def _column_length(column: Any) -> int:
    if isinstance(column, (dict, tuple)):
        leaves = tree.flatten(column)
        return len(leaves[0]) if leaves else 0
    return len(column)


def _index_column(column: Any, index: np.ndarray) -> Any:
    """Rows ``index`` of a column: array, list of row values, or nested structure of arrays."""
    if isinstance(column, np.ndarray):
        return column[index]
    if isinstance(column, (dict, tuple)):
        return tree.map_structure(lambda leaf: leaf[index], column)
    return [column[i] for i in index.tolist()]


def _row_value(column: Any, i: int) -> Any:
    if isinstance(column, (dict, tuple)):
        return tree.map_structure(lambda leaf: leaf[i], column)
    return column[i]


def _is_array_like(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, bool, int, float))


def _stack_column(name: str, values: list[Any], like: Any) -> Any:
    """Put row values back into a column of the same kind as ``like`` (or inferred)."""
    as_array = (
        isinstance(like, np.ndarray) if like is not None else all(map(_is_array_like, values))
    )
    if not as_array:
        return list(values)
    if not values:
        return like[:0] if like is not None else np.zeros(0)
    try:
        return np.stack([np.asarray(v) for v in values])
    except ValueError as err:
        if name == "obs" and like is not None:
            # Raw obs may come stacked or as a list of rows (see AgentRows): rows a
            # per-item connector made unlike each other stay a list, as they would.
            return list(values)
        raise ConnectorError(f"column {name!r}: rows do not stack into one array ({err})") from None


class AgentRows:
    """One policy's rows of one round, as named columns of equal length.

    Columns are numpy arrays (first dim = rows), lists of per-row values
    (raw observations, infos, agent ids) or nested structures of arrays.
    Connectors replace columns in place (``rows["obs"] = ...``) and return
    the same object.
    """

    __slots__ = ("columns",)

    def __init__(self, columns: Mapping[str, Any] | None = None) -> None:
        self.columns: dict[str, Any] = dict(columns or {})

    def __getitem__(self, name: str) -> Any:
        return self.columns[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.columns[name] = value

    def __delitem__(self, name: str) -> None:
        del self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __len__(self) -> int:
        column = self.columns.get("keys")
        if column is None:
            if not self.columns:
                return 0
            column = next(iter(self.columns.values()))
        return _column_length(column)

    def get(self, name: str, default: Any = None) -> Any:
        """A column, or ``default`` when the rows have none of that name."""
        return self.columns.get(name, default)

    def __repr__(self) -> str:
        return f"AgentRows(n={len(self)}, columns={list(self.columns)})"

    def select(self, mask_or_index: np.ndarray | Sequence[int] | slice) -> AgentRows:
        """New rows holding only the selected rows of every column.

        ``mask_or_index``: a boolean mask, integer indices or a slice.
        """
        if isinstance(mask_or_index, slice):
            index = np.arange(len(self))[mask_or_index]
        else:
            index = np.atleast_1d(np.asarray(mask_or_index))
            if index.dtype == np.bool_:
                index = np.flatnonzero(index)
            elif index.size == 0:
                index = index.astype(np.int64)
        return AgentRows({name: _index_column(col, index) for name, col in self.columns.items()})

    def to_items(self) -> list[AgentConnectorDataType]:
        """One item per row, in the per-item view (see ``AgentConnectorDataType``)."""
        env_ids = self.columns.get("env_ids")
        agent_ids = self.columns.get("agent_ids")
        visible = {
            _ITEM_KEYS.get(name, name): column
            for name, column in self.columns.items()
            if name not in _HIDDEN_COLUMNS and name != "agent_ids"
        }
        hidden = {name: self.columns[name] for name in _HIDDEN_COLUMNS if name in self.columns}
        return [
            AgentConnectorDataType(
                env_id=None if env_ids is None else int(env_ids[i]),
                agent_id=None if agent_ids is None else agent_ids[i],
                data={key: _row_value(column, i) for key, column in visible.items()},
                bookkeeping={name: column[i] for name, column in hidden.items()},
            )
            for i in range(len(self))
        ]

    @classmethod
    def from_items(
        cls, items: Sequence[AgentConnectorDataType], like: AgentRows | None = None
    ) -> Self:
        """Rows from items (per-item view back to columns); columns of ``like`` keep their kind.

        New columns become arrays when every value is a number or array,
        else lists. ``env_ids`` / ``agent_ids`` come from the items' fields.
        """
        keys: list[str] = []
        if like is not None and not items:
            keys = [_ITEM_KEYS.get(n, n) for n in like.columns if n not in _HIDDEN_COLUMNS]
        for item in items:
            keys.extend(k for k in item.data if k not in keys)
        columns: dict[str, Any] = {}
        for key in keys:
            if key in ("env_id", "agent_ids"):
                continue
            if key in _ITEM_KEYS:
                raise ConnectorError(
                    f"item key {key!r} is the runner's column name; in the per-item view "
                    f"it is {_ITEM_KEYS[key]!r}"
                )
            name = _COLUMN_NAMES.get(key, key)
            values = [_item_value(item, position, key) for position, item in enumerate(items)]
            columns[name] = _stack_column(name, values, like.get(name) if like is not None else None)
        for name in _HIDDEN_COLUMNS:
            if like is not None and name in like.columns or any(name in i.bookkeeping for i in items):
                values = [_bookkeeping_value(item, position, name) for position, item in enumerate(items)]
                columns[name] = _stack_column(name, values, like.get(name) if like is not None else None)
        columns["env_ids"] = np.asarray([item.env_id for item in items], dtype=np.int64)
        columns["agent_ids"] = [item.agent_id for item in items]
        return cls(columns)


def _item_value(item: AgentConnectorDataType, position: int, key: str) -> Any:
    try:
        return item.data[key]
    except KeyError:
        raise ConnectorError(f"item {position} has no {key!r} value; other items have one") from None


def _bookkeeping_value(item: AgentConnectorDataType, position: int, name: str) -> Any:
    try:
        return item.bookkeeping[name]
    except KeyError:
        raise ConnectorError(
            f"item {position} (agent {item.agent_id!r}) has no trajectory bookkeeping "
            f"({name!r}): a connector that adds a row must copy an existing item "
            "(copy.deepcopy(item)) and change that"
        ) from None


@dataclass
class ActionRows:
    """A policy's output for the rows it evaluated (aligned with ``input_rows``).

    ``actions`` is an array or a nested structure of arrays (first dim = rows);
    ``state_outs`` a list of arrays; ``extra`` a dict of arrays (e.g.
    ``action_logp``, ``vf_preds``).
    """

    actions: Any
    state_outs: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    env_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    agent_ids: list[Any] = field(default_factory=list)
    input_rows: AgentRows | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def replace(self, **changes: Any) -> ActionRows:
        """A copy with some fields changed (connectors never mutate their input)."""
        return replace(self, **changes)

    @classmethod
    def of_item(cls, item: ActionConnectorDataType) -> ActionRows:
        """One row holding ``item`` (so a pipeline can run on a single item)."""
        action, state_outs, extra = item.output

        def one_row(value: Any) -> np.ndarray:
            return np.asarray(value)[None]

        return cls(
            actions=tree.map_structure(one_row, action),
            state_outs=[one_row(state) for state in state_outs],
            extra={name: tree.map_structure(one_row, value) for name, value in extra.items()},
            keys=np.zeros(1, dtype=np.int64),
            env_ids=np.asarray([item.env_id], dtype=np.int64),
            agent_ids=[item.agent_id],
            input_rows=AgentRows({name: [value] for name, value in item.input_dict.items()}),
        )

    def to_items(self) -> list[ActionConnectorDataType]:
        """One item per row, with the row of ``input_rows`` as its ``input_dict``."""
        inputs = self.input_rows.columns if self.input_rows is not None else {}
        return [
            ActionConnectorDataType(
                env_id=int(self.env_ids[i]),
                agent_id=self.agent_ids[i],
                input_dict={name: _row_value(col, i) for name, col in inputs.items()},
                output=(
                    _row_value(self.actions, i),
                    [state[i] for state in self.state_outs],
                    {name: _row_value(value, i) for name, value in self.extra.items()},
                ),
            )
            for i in range(len(self))
        ]

    @classmethod
    def from_items(cls, items: Sequence[ActionConnectorDataType], like: ActionRows) -> ActionRows:
        """Rows from items that map one to one onto the rows of ``like``."""
        if len(items) != len(like):
            raise ConnectorError(
                f"an action connector must return one item per row: got {len(items)} for {len(like)} rows"
            )
        if not items:
            return like.replace()

        def stack(*values: Any) -> np.ndarray:
            return np.stack([np.asarray(v) for v in values])

        actions, state_outs, extra = zip(*(item.output for item in items))
        return like.replace(
            actions=tree.map_structure(stack, *actions),
            state_outs=[stack(*column) for column in zip(*state_outs)],
            extra={name: tree.map_structure(stack, *(e[name] for e in extra)) for name in extra[0]},
        )
