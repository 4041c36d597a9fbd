"""Numbered key tuples for the shared-memory step data (see `shared_buffers`).

Each side numbers the key tuples of the dicts it writes (obs, rewards, flags,
infos, actions) as they first appear; a new number travels pickled once with
the message that first uses it, so both sides' tables stay equal, and each
number names the slots its keys occupy in the block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from marl_runner.envs.multi_agent_env import AgentID

#: Distinct key tuples per direction; past it new ones take the pickled path.
MAX_KEY_SETS = 4096
_ALL = "__all__"


class KeySets:
    """Key tuples numbered in the order they first appear, and the slots they name."""

    def __init__(self, agents: Sequence[AgentID]) -> None:
        self.slot_of = {agent: i for i, agent in enumerate(agents)}
        self.num_agents = len(agents)
        self.ids: dict[tuple, int] = {}
        self.keys: list[tuple] = []
        #: Per key set: slot of each key (`"__all__"`: `num_agents`), None if one has none.
        self.slots: list[list[int] | None] = []
        #: Per key set: the same slots as one numpy index (a slice where they are
        #: consecutive), so a row's values are written in one call.
        self.index: list[slice | np.ndarray | None] = []
        #: Per key set: whether its slots are 0, 1, ... (values read as a row's head).
        self.prefix: list[bool] = []
        #: Per key set: its slots if all are agents' (not `"__all__"`), else None.
        self.agent_slots: list[list[int] | None] = []

    def id_of(self, keys: tuple, new: list[tuple[int, tuple]]) -> int:
        """`keys`' number, numbering it (and noting it in `new`) if unseen; -1 if full."""
        known = self.ids.get(keys)
        if known is not None:
            return known
        if len(self.keys) >= MAX_KEY_SETS:
            return -1
        number = self.learn(len(self.keys), keys)
        new.append((number, keys))
        return number

    def learn(self, number: int, keys: tuple) -> int:
        """Enter the key set the other side numbered (again, after an interruption: no-op)."""
        if number == len(self.keys):
            slot_of = self.slot_of
            slots = [slot_of.get(key, self.num_agents if key == _ALL else -1) for key in keys]
            self.ids[keys] = number
            self.keys.append(keys)
            known = -1 not in slots
            self.slots.append(slots if known else None)
            self.index.append(_index_of(slots) if known else None)
            self.prefix.append(known and slots == list(range(len(slots))))
            agents_only = known and (not slots or max(slots) < self.num_agents)
            self.agent_slots.append(slots if agents_only else None)
        return number


def _index_of(slots: list[int]) -> slice | np.ndarray:
    """`slots` as a numpy index: a slice when they are consecutive, else an index array."""
    start = slots[0] if slots else 0
    if slots == list(range(start, start + len(slots))):
        return slice(start, start + len(slots))
    return np.array(slots, np.intp)
