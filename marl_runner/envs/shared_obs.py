"""Obs arrays from worker processes to the parent through shared memory.

Pickling obs through a pipe copies them several times and, for image obs
(pistonball: 3.3 MB per step), costs more than the env step itself on a busy
machine. Instead, a worker writes each reply's obs into one shared-memory
block and sends only their place in it; the parent copies them out before
its next request, which is what makes reusing the block safe.
"""

from __future__ import annotations

import contextlib
import os
from multiprocessing import shared_memory
from typing import NamedTuple

import numpy as np

from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict

_ALIGNMENT = 64
_MIN_CAPACITY = 1 << 16
_SHM_DIR = "/dev/shm"


class SharedObs(NamedTuple):
    """Where an obs dict of equal-shaped arrays lies in the worker's block."""

    agents: tuple[AgentID, ...]
    dtype: str
    shape: tuple[int, ...]
    offset: int


class SharedObsWriter:
    """Worker side: packs obs dicts into a shared-memory block that grows as needed.

    With `name_prefix`, blocks are named `name_prefix` + a counter, so that
    whoever kills the worker can find and free them (`unlink_blocks`).
    """

    def __init__(self, name_prefix: str | None = None) -> None:
        self.block: shared_memory.SharedMemory | None = None
        self._used = 0
        self._renamed = False
        self._name_prefix = name_prefix
        self._blocks_made = 0

    def start_reply(self) -> None:
        """Begin filling the block afresh (the parent has copied the last reply out)."""
        self._used = 0
        self._renamed = False

    def pack(self, obs: MultiAgentDict) -> MultiAgentDict | SharedObs:
        """`obs` itself, or its place in the block when all obs are alike arrays."""
        if len(obs) < 2:
            return obs
        values = list(obs.values())
        first = values[0]
        if type(first) is not np.ndarray or first.dtype.hasobject:
            return obs
        shape, dtype = first.shape, first.dtype
        for value in values:
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return obs
        offset = self._reserve(len(values) * first.nbytes)
        rows = np.ndarray((len(values), *shape), dtype, buffer=self.block.buf, offset=offset)
        for index, value in enumerate(values):  # (0-d obs: a row is a scalar, not a view)
            rows[index] = value
        del rows  # release the buffer export, else the block could not be replaced
        return SharedObs(tuple(obs), dtype.str, shape, offset)

    def new_block_name(self) -> str | None:
        """The block's name if it changed during this reply (the parent must re-attach)."""
        return self.block.name if self._renamed and self.block is not None else None

    def close(self) -> None:
        """Unlinks the block too: a worker that exits cleanly frees its own shared memory
        (unless the parent, done waiting for it, freed it first)."""
        if self.block is not None:
            self.block.close()
            with contextlib.suppress(FileNotFoundError):
                self.block.unlink()
            self.block = None

    def _reserve(self, nbytes: int) -> int:
        offset = -(-self._used // _ALIGNMENT) * _ALIGNMENT
        needed = offset + nbytes
        if self.block is None or needed > self.block.size:
            self._grow(max(needed, 2 * (self.block.size if self.block else 0), _MIN_CAPACITY))
        self._used = needed
        return offset

    def _grow(self, capacity: int) -> None:
        name = None
        if self._name_prefix is not None:
            name = f"{self._name_prefix}{self._blocks_made}"
            self._blocks_made += 1
        bigger = shared_memory.SharedMemory(name=name, create=True, size=capacity)
        if self.block is not None:
            bigger.buf[: self._used] = self.block.buf[: self._used]
            self.close()
        self.block = bigger
        self._renamed = True


class SharedObsReader:
    """Parent side: copies obs out of one worker's block."""

    def __init__(self) -> None:
        self.block: shared_memory.SharedMemory | None = None

    def attach(self, name: str) -> None:
        """Follows the writer to a new block after it grew (the old one is detached)."""
        self.detach()
        self.block = shared_memory.SharedMemory(name=name)

    def unpack(self, shared: SharedObs) -> MultiAgentDict:
        """A new obs dict: per-agent views of one array copied out of the block."""
        count = len(shared.agents)
        rows = np.ndarray(
            (count, *shared.shape), shared.dtype, buffer=self.block.buf, offset=shared.offset
        ).copy()
        return dict(zip(shared.agents, rows))

    def detach(self, unlink: bool = False) -> None:
        """Stop using the block; `unlink` frees it when its worker died without doing so."""
        if self.block is not None:
            self.block.close()
            if unlink:
                try:
                    self.block.unlink()
                except FileNotFoundError:
                    pass
            self.block = None


def unlink_blocks(name_prefix: str) -> list[str]:
    """Free every block a (killed) writer with `name_prefix` left; returns their names.

    Linux keeps POSIX shared memory under /dev/shm; elsewhere this finds nothing.
    """
    try:
        names = [name for name in os.listdir(_SHM_DIR) if name.startswith(name_prefix)]
    except OSError:
        return []
    for name in names:
        try:
            block = shared_memory.SharedMemory(name=name)
        except (FileNotFoundError, ValueError, OSError):
            continue
        block.close()
        try:
            block.unlink()  # also tells the resource tracker it is gone
        except FileNotFoundError:
            pass
    return names
