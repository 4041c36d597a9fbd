"""One step reply's results flattened once for all its readers.

A worker checks the output of a request's sub-envs (`subprocess_checks`) and
writes it into its slot block (`shared_bulk`). Both need every dict's keys
in order and their values, and each pass over 32 sub-envs of 8 agents costs
microseconds, as much as a cheap env's step. So every field's dicts (obs,
rewards, terminateds, truncateds, infos) are read in one pass for their
keys, one for their values and one for the values' types, each made on
first use and kept for the next reader of the same reply.

Two replies whose `keys()` are equal have the same keys in the same order
in every dict of every field (the flat keys alone could shift from one dict
to the next; the lengths pin them down).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from marl_runner.envs.multi_agent_env import MultiAgentDict

#: The fields of a step result, in order.
OBS, REWARDS, TERMINATEDS, TRUNCATEDS, INFOS = range(5)


class ReplyColumns:
    """The step results of one reply (each `(obs, rewards, terminateds, truncateds,
    infos)`, all dicts) by field; read-only: built after the envs stepped."""

    __slots__ = ("dicts", "_keys", "_values", "_types")

    def __init__(self, results: Sequence[Sequence[MultiAgentDict]]) -> None:
        #: Per field, one dict per sub-env, in the results' order.
        self.dicts: list[tuple[MultiAgentDict, ...]] = list(zip(*results)) or [()] * 5
        self._keys: tuple[list, list[int]] | None = None
        self._values: list[list | None] = [None] * 5
        self._types: list[type] | None = None

    def keys(self) -> tuple[list, list[int]]:
        """Every key of every field's dicts, in order, and each dict's length."""
        if self._keys is None:
            dicts = list(chain.from_iterable(self.dicts))
            self._keys = (list(chain.from_iterable(dicts)), list(map(len, dicts)))
        return self._keys

    def values(self, field: int) -> list:
        """Every value of the field's dicts, in order."""
        values = self._values[field]
        if values is None:
            values = self._values[field] = list(
                chain.from_iterable(map(dict.values, self.dicts[field]))
            )
        return values

    def types(self) -> list[type]:
        """The type of every value of every field, in order."""
        if self._types is None:
            self._types = list(map(type, chain.from_iterable(map(self.values, range(5)))))
        return self._types
