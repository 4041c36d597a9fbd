"""Whole step messages through a slot block in one pass: the many-agent hot path.

`SlotBlock` writes and reads one sub-env at a time, a few microseconds of
Python per sub-env on each side of the pipe, every round: with 64 sub-envs
of 8 agents that is most of what a round costs beyond the envs. Here each
stage runs over all the sub-envs of one message at C level (`map`, `zip`,
`chain`) and each kind of value (actions, obs, rewards, each flag) goes into
the block in one numpy call, at flat slot positions (`sub-env * width +
slot`) that are computed once and reused while the sub-envs and their key
sets stay the same, as they do round after round. A worker reads each reply
once (`ReplyColumns`: one pass for every key, one per field for the values,
one for their types); while the keys and the value types equal the last
reply's, all that is left per round is to look at the values themselves
(obs dtypes and shapes, empty infos) and copy them.

Only the common case takes this path: agents sharing one array space (or
one Discrete action space), every key set already numbered and naming
slotted agents, float rewards, bool flags, empty infos, and for reading
every sub-env of the reply with the same key sets. Anything else makes the
caller take the per-sub-env path, which handles it, so both paths put the
same things in the block and hand out equal results.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np

from marl_runner.envs.multi_agent_env import MultiAgentDict
from marl_runner.envs.reply_columns import (
    INFOS,
    OBS,
    REWARDS,
    TERMINATEDS,
    TRUNCATEDS,
    ReplyColumns,
)
from marl_runner.envs.step_block import StepBlock

# `block` arguments are `shared_buffers.SlotBlock`s and `leaf` ones its slot leaves (dtype,
# shape), typed Any here: shared_buffers imports this module, and imports go one way.

_FLOATS = {float, np.float64, np.float32}
_BOOLS = {bool, np.bool_}
_DICTS = {dict}
_ARRAYS = {np.ndarray}
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_NDIM = attrgetter("ndim")
# Result codes of a reply on this path: float rewards, obs not Dicts (see shared_buffers).
_FLOAT_REWARDS, _NO_ORDER = 0, -1


def _values(dicts: Sequence[MultiAgentDict]) -> list[Any]:
    """The values of every dict, in order, as one flat list."""
    return list(chain.from_iterable(map(dict.values, dicts)))


class FlatSlots:
    """Flat positions of one message's values in a `[sub-envs, width]` array, kept while
    the message names the same sub-envs with the same key sets (most rounds)."""

    def __init__(self, slots: list[list[int] | None], width: int) -> None:
        self._slots = slots  # a KeySets' `slots`, which grows in place as sets are learned
        self._width = width
        self._envs: list[int] | None = None
        self._numbers: list[int] | None = None
        self._index: slice | np.ndarray = slice(0, 0)

    def of(self, envs: list[int], numbers: list[int]) -> slice | np.ndarray:
        """The positions of sub-env `envs[i]`'s values under key set `numbers[i]`, in order
        (`_positions`)."""
        if numbers == self._numbers and envs == self._envs:
            return self._index
        self._index = _positions(envs, numbers, self._slots, self._width)
        self._envs, self._numbers = envs, numbers
        return self._index


def _stacked(values: list[Any], leaf: Any) -> np.ndarray | None:
    """`values` as one array `[len(values), *leaf.shape]` if every one is an ndarray of
    the leaf's exact shape and dtype, else None."""
    if list(map(type, values)).count(np.ndarray) != len(values):
        return None
    return _stacked_arrays(values, leaf)


def _stacked_arrays(values: list[np.ndarray], leaf: Any) -> np.ndarray | None:
    """`values`, all of type ndarray, as one array `[len(values), *leaf.shape]` if every
    one has the leaf's exact shape and dtype, else None (a count compares by identity
    first: cheaper than a set of them)."""
    count = len(values)
    shape = leaf.shape
    if list(map(_DTYPE, values)).count(leaf.dtype) != count:
        return None
    if len(shape) == 1:  # length and ndim: two ints each, no shape tuple made per value
        if (
            list(map(len, values)).count(shape[0]) != count
            or list(map(_NDIM, values)).count(1) != count
        ):
            return None
    elif list(map(_SHAPE, values)).count(shape) != count:
        return None
    try:
        joined = b"".join(values)  # ~4x faster than np.array(values); C-contiguous ones only
    except (BufferError, TypeError, ValueError):
        return np.array(values)
    return np.frombuffer(joined, leaf.dtype).reshape(count, *leaf.shape)


def _types_fit(columns: ReplyColumns) -> bool:
    """Whether a reply's values are of the types this path takes: ndarray obs, float
    rewards, bool flags, dict infos."""
    return (
        set(map(type, columns.values(OBS))) <= _ARRAYS
        and set(map(type, columns.values(REWARDS))) <= _FLOATS
        and set(map(type, columns.values(TERMINATEDS))) <= _BOOLS
        and set(map(type, columns.values(TRUNCATEDS))) <= _BOOLS
        and set(map(type, columns.values(INFOS))) <= _DICTS
    )


def _put_flags(array: np.ndarray, positions: slice | np.ndarray, flags: list[Any]) -> None:
    """Flags (bools) into `array` at flat `positions`; all False (most rounds): one fill."""
    array.reshape(-1)[positions] = flags if any(flags) else False


def _positions(
    envs: list[int], numbers: list[int], slots: list[list[int] | None], width: int
) -> slice | np.ndarray:
    """Flat positions in a `[sub-envs, width]` array of sub-env `envs[i]`'s values under
    key set `numbers[i]`, in order: a slice where they follow each other (one copy)."""
    positions = list(
        chain.from_iterable(
            [env * width + slot for slot in slots[number]] for env, number in zip(envs, numbers)
        )
    )
    first = positions[0] if positions else 0
    if positions == list(range(first, first + len(positions))):
        return slice(first, first + len(positions))
    return np.array(positions, np.intp)


class _ReplyPlan:
    """Where a reply's values go in the block and the result codes it leaves there; it
    holds for the next replies of the same sub-envs with the same keys (`ReplyColumns.keys`,
    same order), most rounds: no key tuple made or hashed, no position computed."""

    __slots__ = ("envs", "keys", "obs", "rewards", "terminateds", "truncateds", "codes", "types")

    def __init__(
        self,
        envs: list[int],
        keys: tuple[list, list[int]],
        positions: list[slice | np.ndarray],
        codes: list[list[int]],
    ) -> None:
        self.envs = envs
        self.keys = keys
        self.obs, self.rewards, self.terminateds, self.truncateds = positions
        self.codes = codes
        #: The value types of the last reply that fitted (`ReplyColumns.types`).
        self.types: list[type] = []


class BulkWriter:
    """Writes whole step requests (parent) or replies (worker) into one side's block."""

    def __init__(self, block: Any) -> None:
        self.block = block
        slots = block.out_sets.slots
        self._actions = FlatSlots(slots, len(block.layout.agents))
        #: The last reply's plan (None: none fitted yet).
        self._plan: _ReplyPlan | None = None

    def request(self, envs: list[int], actions: Sequence[MultiAgentDict]) -> bool:
        """Actions of sub-envs `envs` (local indices) into the block; False: use the
        per-sub-env path (nothing here is then relied on)."""
        layout = self.block.layout
        values_of = layout.actions
        if not values_of.uniform:
            return False
        sets = self.block.out_sets
        numbers = list(map(sets.ids.get, map(tuple, actions)))
        if None in numbers or not all(map(sets.agent_slots.__getitem__, numbers)):
            return False  # a new key set, one naming an unslotted agent, or no actions
        values = _values(actions)
        leaf = values_of.codecs[0]
        target = values_of.arrays[0].reshape(-1, *leaf.shape)
        index = self._actions.of(envs, numbers)
        if leaf.scalar:
            if list(map(type, values)).count(int) != len(values):  # ~40 % less than a set
                return False
            try:
                target[index] = values
            except OverflowError:
                return False
        else:
            stacked = _stacked(values, leaf)
            if stacked is None:
                return False
            target[index] = stacked
        layout.request[: len(envs) + 1] = [len(envs), *envs]
        layout.action_sets[envs] = numbers
        return True

    def reply(self, envs: list[int], columns: ReplyColumns) -> bool:
        """The step results of sub-envs `envs` (local indices), by field, into the block;
        False: use the per-sub-env path (nothing here is then relied on)."""
        block = self.block
        layout = block.layout
        values_of = layout.obs
        if not values_of.uniform or values_of.codecs[0].scalar or not envs:
            return False
        keys = columns.keys()
        plan = self._plan
        if plan is None or keys != plan.keys or envs != plan.envs:
            plan = self._plan_for(envs, columns, keys)
            if plan is None:
                return False
            self._plan = plan
        types = columns.types()
        if types != plan.types:  # the same types as last time (most rounds) fit again
            if not _types_fit(columns):
                return False
            plan.types = types
        leaf = values_of.codecs[0]
        obs = _stacked_arrays(columns.values(OBS), leaf)
        if obs is None or any(columns.values(INFOS)):
            return False
        values_of.arrays[0].reshape(-1, *leaf.shape)[plan.obs] = obs
        layout.rewards.reshape(-1)[plan.rewards] = columns.values(REWARDS)
        _put_flags(layout.terminateds, plan.terminateds, columns.values(TERMINATEDS))
        _put_flags(layout.truncateds, plan.truncateds, columns.values(TRUNCATEDS))
        written = block.written_codes
        codes = plan.codes
        if not all(map(is_, map(written.__getitem__, envs), codes)):  # another wrote since
            layout.codes[envs] = codes
            for env, code in zip(envs, codes):
                written[env] = code
        return True

    def _plan_for(
        self, envs: list[int], columns: ReplyColumns, keys: tuple[list, list[int]]
    ) -> _ReplyPlan | None:
        """The plan of a reply whose keys differ from the last one's; None when a key set
        is not numbered yet (the per-sub-env path numbers it) or names an agent (or, for
        obs and rewards, `"__all__"`) without a slot."""
        sets = self.block.out_sets
        numbers = [list(map(sets.ids.get, map(tuple, dicts))) for dicts in columns.dicts]
        if any(None in field for field in numbers):
            return None
        obs_n, rewards_n, terminateds_n, truncateds_n, infos_n = numbers
        agent_slots, slots = sets.agent_slots, sets.slots
        if (
            not all(map(agent_slots.__getitem__, obs_n))
            or not all(map(agent_slots.__getitem__, rewards_n))
            or None in map(slots.__getitem__, chain(terminateds_n, truncateds_n))
        ):
            return None
        width = len(self.block.layout.agents)
        obs = _positions(envs, obs_n, slots, width)
        positions = [
            obs,
            obs if rewards_n == obs_n else _positions(envs, rewards_n, slots, width),
            _positions(envs, terminateds_n, slots, width + 1),
            _positions(envs, truncateds_n, slots, width + 1),
        ]
        codes = list(
            map(
                list,
                zip(obs_n, rewards_n, terminateds_n, truncateds_n, infos_n,
                    repeat(_FLOAT_REWARDS), repeat(_NO_ORDER)),
            )
        )
        return _ReplyPlan(list(envs), keys, positions, codes)


class BulkReader:
    """Reads whole step replies out of a copy of the block (the parent's side)."""

    def __init__(self, block: Any) -> None:
        self.block = block
        #: Per key set number: a function giving a row's values at its slots, in order.
        self._pickers: dict[int, Callable[[list], Sequence[Any]]] = {}
        #: All-False flag dicts and empty-infos dicts, by (key set number, kind).
        self._shared_dicts: dict[tuple[int, bool | None], MultiAgentDict] = {}
        #: Every sub-env, in order: a reply of those is read with slices (no index arrays).
        self._every = list(range(block.layout.num_envs))

    def step_block(self, envs: list[int], env_ids: list[int]) -> StepBlock | None:
        """The step results of sub-envs `envs` (local indices; `env_ids` their global ids)
        as one `StepBlock`, or None when they do not fit one: not every sub-env has the
        same result codes, or those are off this path, or rewards do not name exactly the
        obs' agents, or a flag is set. Read from the block itself, whose results stay put
        until the worker is sent its next request; obs and rewards are copied out."""
        layout = self.block.layout
        values_of = layout.obs
        if not envs or not values_of.uniform or values_of.codecs[0].scalar:
            return None
        rows = slice(len(envs)) if envs == self._every else np.array(envs, np.intp)
        codes = layout.codes[rows]
        first = codes[0]
        if not (codes == first).all():
            return None
        obs_n, rewards_n, terminateds_n, truncateds_n, infos_n, reward_kind, order_n = (
            first.tolist()
        )
        if reward_kind != _FLOAT_REWARDS or order_n != _NO_ORDER or rewards_n != obs_n:
            return None
        index = self.block.in_sets.index
        if (
            _cells(layout.terminateds, rows, index[terminateds_n]).any()
            or _cells(layout.truncateds, rows, index[truncateds_n]).any()
        ):
            return None
        return StepBlock(
            env_ids,
            self.block.in_sets.keys[obs_n],
            _cells(values_of.arrays[0], rows, index[obs_n], copy=True),
            _cells(layout.rewards, rows, index[obs_n], copy=True),
            self._shared(terminateds_n, False),
            self._shared(truncateds_n, False),
            self._shared(infos_n, None),
        )

    def results(self, copies: tuple, envs: list[int]) -> tuple[list, ...] | None:
        """`(obs, rewards, terminateds, truncateds, infos)`, each a list of one dict per
        sub-env of `envs`; None when they do not all share one set of result codes
        (or those are off this path): use the per-sub-env path."""
        obs_copy, rewards, terminateds, truncateds, codes = copies
        block = self.block
        values_of = block.layout.obs
        # A scalar leaf's copy is a list (its snapshot): the per-sub-env path reads it.
        if not envs or not values_of.uniform or values_of.codecs[0].scalar:
            return None
        first = codes[envs[0]]
        for env in envs:
            if codes[env] != first:
                return None
        obs_n, rewards_n, terminateds_n, truncateds_n, infos_n, reward_kind, order_n = first
        if reward_kind != _FLOAT_REWARDS or order_n != _NO_ORDER:
            return None
        sets = block.in_sets
        keys = sets.keys
        count = len(envs)
        # Obs: one view per agent row of the copy, handed out in sub-env order.
        obs_keys = keys[obs_n]
        picked = obs_copy if envs == self._every else obs_copy[envs]
        if not sets.prefix[obs_n] or len(obs_keys) != picked.shape[1]:
            picked = picked[:, sets.slots[obs_n]]
        rows = iter(picked.reshape(-1, *picked.shape[2:]))
        # zip stops at the last key, so each dict takes its sub-env's rows of the iterator.
        obs = list(map(dict, map(zip, repeat(obs_keys, count), repeat(rows, count))))
        out = [obs]
        for table, number in (
            (rewards, rewards_n), (terminateds, terminateds_n), (truncateds, truncateds_n)
        ):
            table_rows = [table[env] for env in envs]
            if table is not rewards and not any(map(any, table_rows)):
                out.append([self._shared(number, False)] * count)
                continue
            if not sets.prefix[number]:
                table_rows = list(map(self._picker(number), table_rows))
            out.append(list(map(dict, map(zip, repeat(keys[number], count), table_rows))))
        out.append([self._shared(infos_n, None)] * count)
        return tuple(out)

    def _shared(self, number: int, flag: bool | None) -> MultiAgentDict:
        """The one dict handed out for key set `number` when all its values are False
        (`flag` False: flags) or empty infos (`flag` None), as an env may share its own."""
        shared = self._shared_dicts.get((number, flag))
        if shared is None:
            keys = self.block.in_sets.keys[number]
            shared = dict.fromkeys(keys, False) if flag is False else {key: {} for key in keys}
            self._shared_dicts[(number, flag)] = shared
        return shared

    def request(self, snapshot: Any, envs: list[int], numbers: list[int]) -> list | None:
        """The action dicts of sub-envs `envs` (key set `numbers[i]` each) out of a copy of
        the action slots; None when their key sets differ: use the per-sub-env path."""
        first = numbers[0] if numbers else None
        if first is None or numbers.count(first) != len(numbers):
            return None
        sets = self.block.in_sets
        rows = snapshot if envs == self._every else list(map(snapshot.__getitem__, envs))
        return list(map(_dict_maker(sets.keys[first], tuple(sets.slots[first])), rows))

    def _picker(self, number: int) -> Callable[[list], Sequence[Any]]:
        picker = self._pickers.get(number)
        if picker is None:
            slots = self.block.in_sets.slots[number]
            picker = itemgetter(*slots) if len(slots) > 1 else _single(slots)
            self._pickers[number] = picker
        return picker


@functools.lru_cache(maxsize=256)
def _dict_maker(keys: tuple, slots: tuple[int, ...]) -> Callable[[Sequence[Any]], dict]:
    """A function making `{keys[i]: row[slots[i]]}` (in that order) out of a row.

    One dict display with the keys bound: ~40 % faster than `dict(zip(keys, row))`,
    which builds a pair per key and grows the dict as it goes; the worker makes 32
    such action dicts per request. The source holds only indices, never a key."""
    names = {f"k{i}": key for i, key in enumerate(keys)}
    items = ", ".join(f"k{i}: row[{int(slot)}]" for i, slot in enumerate(slots))
    return eval(f"lambda row: {{{items}}}", names)


def _cells(
    array: np.ndarray, rows: slice | np.ndarray, columns: slice | np.ndarray, copy: bool = False
) -> np.ndarray:
    """`array`'s `rows` x `columns` (each a slice or an index array); `copy`: never a view
    of `array` (only two slices give one)."""
    if type(rows) is not slice and type(columns) is not slice:
        return array[np.ix_(rows, columns)]
    cells = array[rows, columns]
    return cells.copy() if copy and type(rows) is slice and type(columns) is slice else cells


def _single(slots: list[int]) -> Callable[[list], Sequence[Any]]:
    """A picker for key sets of at most one slot (itemgetter gives a bare value there)."""
    if not slots:
        return lambda row: ()
    slot = slots[0]
    return lambda row: (row[slot],)
