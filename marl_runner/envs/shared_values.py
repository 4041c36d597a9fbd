"""How the values of one kind (obs, or actions) of every agent sit in a worker's slot block.

A space becomes a codec (`codec_for`): a `_Leaf` (one array slot per
sub-env and agent: a Box of any dtype, or a Discrete/MultiDiscrete/
MultiBinary number) or a `_DictCodec` (a Dict of those, part by part).
`SlotValues` holds the arrays of one kind for all the agents of a block and
writes and reads one sub-env's values, so that what comes out equals what
went in (`shared_buffers` lays out the block and moves whole results).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.envs.multi_agent_env import MultiAgentDict

# Integer values that fit a scalar slot without a closer look (the others go through
# `_Leaf.fits`).
_PLAIN_INT = {int}


class _Leaf:
    """One array (or scalar) per slot: `shape` and `dtype` of a space's values."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, scalar: bool) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.scalar = scalar

    def key(self) -> tuple:
        return ("leaf", self.shape, self.dtype.str, self.scalar)

    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def fits(self, value: Any) -> bool:
        if self.scalar:
            kind = type(value)
            return (kind is int or isinstance(value, np.integer)) and kind is not bool
        dtype = getattr(value, "dtype", None)
        return (
            type(value) is np.ndarray
            and value.shape == self.shape
            and (dtype is self.dtype or dtype == self.dtype)
        )


class _DictCodec:
    """A Dict space: its keys, in order, each with its own codec."""

    def __init__(self, keys: tuple, codecs: list[_Leaf | _DictCodec]) -> None:
        self.keys = keys
        self.codecs = codecs

    def key(self) -> tuple:
        return ("dict", self.keys, tuple(c.key() for c in self.codecs))

    def leaves(self) -> list[_Leaf]:
        out: list[_Leaf] = []
        for codec in self.codecs:
            out.extend(codec.leaves() if isinstance(codec, _DictCodec) else [codec])
        return out


def codec_for(space: gym.Space) -> _Leaf | _DictCodec | None:
    """How values of `space` sit in a slot; None for spaces that always go pickled."""
    if isinstance(space, gym.spaces.Box):
        return _Leaf(tuple(space.shape), space.dtype, False)
    if isinstance(space, gym.spaces.Discrete):
        return _Leaf((), np.int64, True)
    if isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return _Leaf(tuple(space.shape), space.dtype, False)
    if isinstance(space, gym.spaces.Dict):
        codecs = [codec_for(sub) for sub in space.spaces.values()]
        if any(c is None for c in codecs):
            return None
        return _DictCodec(tuple(space.spaces), codecs)
    return None


class SlotValues:
    """The slots of one kind of value (obs or actions) for every (sub-env, agent).

    Agents sharing one array space ("uniform") live in one array
    `[num_envs, num_agents, *shape]` written and read in bulk; otherwise
    each agent has its own arrays per leaf of its codec.
    """

    def __init__(self, codecs: list[_Leaf | _DictCodec | None], num_envs: int) -> None:
        self.codecs = codecs
        self.num_envs = num_envs
        first = codecs[0] if codecs else None
        self.uniform = (
            isinstance(first, _Leaf) and all(c is not None and c.key() == first.key() for c in codecs)
        )
        self.arrays: list[Any] = []

    def specs(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The arrays to allocate, in order."""
        if self.uniform:
            leaf = self.codecs[0]
            return [((self.num_envs, len(self.codecs), *leaf.shape), leaf.dtype)]
        specs = []
        for codec in self.codecs:
            if codec is not None:
                leaves = codec.leaves() if isinstance(codec, _DictCodec) else [codec]
                specs.extend(((self.num_envs, *leaf.shape), leaf.dtype) for leaf in leaves)
        return specs

    def bind(self, arrays: list[np.ndarray]) -> None:
        """Take the allocated arrays (per agent: one per leaf, None for no slot)."""
        if self.uniform:
            self.arrays = arrays
            return
        it = iter(arrays)
        self.arrays = []
        for codec in self.codecs:
            if codec is None:
                self.arrays.append(None)
            else:
                leaves = codec.leaves() if isinstance(codec, _DictCodec) else [codec]
                self.arrays.append([next(it) for _ in leaves])

    def write(
        self,
        env: int,
        slots: Sequence[int],
        index: slice | np.ndarray,
        values: list[Any],
        order: tuple | None = None,
    ) -> bool:
        """Write one sub-env's values into the agents' `slots` (`index`: the same slots as
        one numpy index); False if one does not fit.

        `order`: the key order of Dict values (gymnasium sorts a Dict space's keys,
        envs hand out their own order); None: the space's."""
        codecs = self.codecs
        if not values:  # a round in which none of these agents observes
            return True
        if self.uniform:
            leaf = codecs[0]
            rows = self.arrays[0][env]
            if leaf.scalar and set(map(type, values)) <= _PLAIN_INT:
                try:
                    rows[index] = values  # one numpy call for all agents
                except OverflowError:
                    return False
                return True
            if leaf.scalar:
                for slot, value in zip(slots, values):
                    if not leaf.fits(value):
                        return False
                    rows[slot] = value
                return True
            shape, dtype = leaf.shape, leaf.dtype
            for value in values:
                if type(value) is not np.ndarray or value.shape != shape or (
                    value.dtype is not dtype and value.dtype != dtype
                ):
                    return False
            rows[index] = values  # all fit: one numpy call for all agents
            return True
        for slot, value in zip(slots, values):
            codec = codecs[slot]
            if codec is None or not _write(codec, self.arrays[slot], env, value, 0, order):
                return False
        return True

    def snapshot(self) -> Any:
        """A private copy of every slot, taken before the block is written again."""
        if self.uniform:
            copy = self.arrays[0].copy()
            return copy.tolist() if self.codecs[0].scalar else copy
        return [None if a is None else [leaf.copy() for leaf in a] for a in self.arrays]

    def read(
        self,
        snapshot: Any,
        env: int,
        slots: Sequence[int],
        keys: tuple,
        order: tuple | None = None,
        prefix: bool = False,
    ) -> MultiAgentDict:
        """One sub-env's dict out of a snapshot: `keys` in order, values from `slots`
        (Dict values with their keys in `order`); `prefix`: `slots` are 0, 1, ..."""
        if self.uniform:
            rows = snapshot[env]
            if prefix:
                return dict(zip(keys, rows))  # zip stops at the last key
            return dict(zip(keys, [rows[slot] for slot in slots]))
        out = {}
        for key, slot in zip(keys, slots):
            out[key] = _read(self.codecs[slot], snapshot[slot], env, [0], order)
        return out


def _write(
    codec: _Leaf | _DictCodec,
    arrays: list[np.ndarray],
    env: int,
    value: Any,
    at: int,
    order: tuple | None = None,
) -> bool:
    """Write one value (a Dict's keys in `order`, nested ones in the space's)."""
    if isinstance(codec, _Leaf):
        if not codec.fits(value):
            return False
        arrays[at][env] = value
        return True
    if type(value) is not dict or tuple(value) != (order or codec.keys):
        return False
    if order and (len(order) != len(codec.keys) or any(k not in value for k in codec.keys)):
        return False
    for key, sub in zip(codec.keys, codec.codecs):
        if not _write(sub, arrays, env, value[key], at):
            return False
        at += len(sub.leaves()) if isinstance(sub, _DictCodec) else 1
    return True


def _read(
    codec: _Leaf | _DictCodec,
    arrays: list[np.ndarray],
    env: int,
    at: list[int],
    order: tuple | None = None,
) -> Any:
    if isinstance(codec, _Leaf):
        array = arrays[at[0]]
        at[0] += 1
        return array[env].item() if codec.scalar else array[env]
    values = {key: _read(sub, arrays, env, at) for key, sub in zip(codec.keys, codec.codecs)}
    return {key: values[key] for key in order} if order else values
