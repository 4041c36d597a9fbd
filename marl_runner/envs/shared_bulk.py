"""Whole step messages through a slot block in one pass: the many-agent hot path.

`SlotBlock` writes and reads one sub-env at a time, a few microseconds of
Python per sub-env on each side of the pipe, every round: with 64 sub-envs
of 8 agents that is most of what a round costs beyond the envs. Here each
stage runs over all the sub-envs of one message at C level (`map`, `zip`,
`chain`) and each kind of value (actions, obs, rewards, each flag) goes into
the block in one numpy call, at flat slot positions (`sub-env * width +
slot`) that are computed once and reused while the sub-envs and their key
sets stay the same, as they do round after round.

Only the common case takes this path: agents sharing one array space (or
one Discrete action space), every key set already numbered and naming
slotted agents, float rewards, bool flags, empty infos, and for reading
every sub-env of the reply with the same key sets. Anything else makes the
caller take the per-sub-env path, which handles it, so both paths put the
same things in the block and hand out equal results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np

from marl_runner.envs.multi_agent_env import MultiAgentDict
from marl_runner.envs.step_block import StepBlock

# `block` arguments are `shared_buffers.SlotBlock`s and `leaf` ones its slot leaves (dtype,
# shape), typed Any here: shared_buffers imports this module, and imports go one way.

_FLOATS = {float, np.float64, np.float32}
_INTS = {int}
_BOOLS = {bool, np.bool_}
_DICTS = {dict}
_ARRAYS = {np.ndarray}
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
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
        self._index = np.zeros(0, np.intp)

    def of(self, envs: list[int], numbers: list[int]) -> np.ndarray:
        """The positions of sub-env `envs[i]`'s values under key set `numbers[i]`, in order."""
        if numbers == self._numbers and envs == self._envs:
            return self._index
        slots, width = self._slots, self._width
        positions = chain.from_iterable(
            [env * width + slot for slot in slots[number]] for env, number in zip(envs, numbers)
        )
        self._index = np.fromiter(positions, np.intp)
        self._envs, self._numbers = envs, numbers
        return self._index


def _stacked(values: list[Any], leaf: Any) -> np.ndarray | None:
    """`values` as one array `[len(values), *leaf.shape]` if every one is an ndarray of
    the leaf's exact shape and dtype, else None."""
    if (
        set(map(type, values)) != _ARRAYS
        or set(map(_DTYPE, values)) != {leaf.dtype}
        or set(map(_SHAPE, values)) != {leaf.shape}
    ):
        return None
    try:
        joined = b"".join(values)  # ~4x faster than np.array(values); C-contiguous ones only
    except (BufferError, TypeError, ValueError):
        return np.array(values)
    return np.frombuffer(joined, leaf.dtype).reshape(len(values), *leaf.shape)


class BulkWriter:
    """Writes whole step requests (parent) or replies (worker) into one side's block."""

    def __init__(self, block: Any) -> None:
        self.block = block
        layout = block.layout
        slots = block.out_sets.slots
        num_agents = len(layout.agents)
        self._actions = FlatSlots(slots, num_agents)
        self._obs = FlatSlots(slots, num_agents)
        self._rewards = FlatSlots(slots, num_agents)
        self._terminateds = FlatSlots(slots, num_agents + 1)
        self._truncateds = FlatSlots(slots, num_agents + 1)
        #: Per field of a reply (obs, rewards, terminateds, truncateds, infos): the key
        #: tuples of its last reply and their numbers (the same most rounds: no hashing).
        self._last: list[tuple[list[tuple], list[int | None]]] = [([], [])] * 5
        #: The number lists (per field) whose slots were last found fitting.
        self._checked_numbers: list[list[int | None]] = [[None]] * 5

    def _numbers(self, field: int, keys: list[tuple]) -> list[int | None]:
        """The key set number of each tuple in `keys` (None: not numbered)."""
        last_keys, last_numbers = self._last[field]
        if keys == last_keys:  # equal tuples of the same key objects: compared by identity
            return last_numbers
        numbers = list(map(self.block.out_sets.ids.get, keys))
        if None not in numbers:  # unnumbered sets get numbered by the per-sub-env path
            self._last[field] = (keys, numbers)
        return numbers

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
            if not set(map(type, values)) <= _INTS:
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

    def reply(self, envs: list[int], results: Sequence[Sequence[MultiAgentDict]]) -> bool:
        """Step results of sub-envs `envs` (local indices) into the block; False: use the
        per-sub-env path (nothing here is then relied on)."""
        block = self.block
        layout = block.layout
        values_of = layout.obs
        if not values_of.uniform or values_of.codecs[0].scalar:
            return False
        sets = block.out_sets
        obs, rewards, terminateds, truncateds, infos = zip(*results)
        obs_keys = list(map(tuple, obs))
        obs_n = self._numbers(0, obs_keys)
        numbers = [obs_n]
        for field, dicts in enumerate((rewards, terminateds, truncateds, infos), 1):
            keys = list(map(tuple, dicts))
            numbers.append(obs_n if keys == obs_keys else self._numbers(field, keys))
        if any(None in field for field in numbers):
            return False  # a key set not numbered yet: the per-sub-env path numbers it
        obs_n, rewards_n, terminateds_n, truncateds_n, infos_n = numbers
        # The very number lists checked last time (held there, compared by identity): their
        # slots fit then and key sets never change.
        if not all(map(is_, numbers, self._checked_numbers)):
            agent_slots, slots = sets.agent_slots, sets.slots
            if not all(map(agent_slots.__getitem__, obs_n)) or not all(
                map(agent_slots.__getitem__, rewards_n)
            ):
                return False
            if None in map(slots.__getitem__, chain(terminateds_n, truncateds_n)):
                return False
            self._checked_numbers = numbers
        leaf = values_of.codecs[0]
        obs_values = _stacked(_values(obs), leaf)
        reward_values = _values(rewards)
        terminated_values = _values(terminateds)
        truncated_values = _values(truncateds)
        info_values = _values(infos)
        if (
            obs_values is None
            or not set(map(type, reward_values)) <= _FLOATS
            or not set(map(type, terminated_values)) <= _BOOLS
            or not set(map(type, truncated_values)) <= _BOOLS
            or any(info_values)
            or not set(map(type, info_values)) <= _DICTS
        ):
            return False
        values_of.arrays[0].reshape(-1, *leaf.shape)[self._obs.of(envs, obs_n)] = obs_values
        layout.rewards.reshape(-1)[self._rewards.of(envs, rewards_n)] = reward_values
        flags = layout.terminateds.reshape(-1)
        flags[self._terminateds.of(envs, terminateds_n)] = terminated_values
        flags = layout.truncateds.reshape(-1)
        flags[self._truncateds.of(envs, truncateds_n)] = truncated_values
        codes = list(
            map(
                list,
                zip(obs_n, rewards_n, terminateds_n, truncateds_n, infos_n,
                    repeat(_FLOAT_REWARDS), repeat(_NO_ORDER)),
            )
        )
        written = block.written_codes
        if codes != [written[env] for env in envs]:
            layout.codes[envs] = codes
            for env, code in zip(envs, codes):
                written[env] = code
        return True


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
        if not envs or not values_of.uniform:
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
        picked = obs_copy if envs == list(range(len(obs_copy))) else obs_copy[envs]
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
        rows = [snapshot[env] for env in envs]
        if not sets.prefix[first]:
            rows = list(map(self._picker(first), rows))
        return list(map(dict, map(zip, repeat(sets.keys[first], len(envs)), rows)))

    def _picker(self, number: int) -> Callable[[list], Sequence[Any]]:
        picker = self._pickers.get(number)
        if picker is None:
            slots = self.block.in_sets.slots[number]
            picker = itemgetter(*slots) if len(slots) > 1 else _single(slots)
            self._pickers[number] = picker
        return picker


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
