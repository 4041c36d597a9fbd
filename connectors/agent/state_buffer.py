"""RNN state per trajectory: fed to the policy, updated from its output."""

from __future__ import annotations

import numpy as np

from connectors.agent.keyed import KeyedArray
from connectors.base import AgentConnector, ConnectorContext
from connectors.data import ActionRows, AgentRows


class StateBufferConnector(AgentConnector):
    """Adds ``state_in_0..k`` columns: each row's RNN state from its last policy output.

    A trajectory starts (``is_first``, or a key this connector has not seen)
    from ``ctx.initial_states`` (one array per state, without batch dim),
    read lazily because the runner fills it in after building the policy.
    Does nothing when the policy has no state.

    Reads: ``keys``, ``is_first``. Writes: ``state_in_0..k``.
    ``on_policy_output`` reads ``ActionRows.keys`` and ``state_outs``.
    """

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._states: list[KeyedArray] = []
        self._initial: list[np.ndarray] = []
        self._seen = KeyedArray((), np.bool_)

    def _tables(self) -> list[KeyedArray]:
        """The per-key state tables, (re)made when ``ctx.initial_states`` appears or changes."""
        initial = self.ctx.initial_states or []
        if len(initial) != len(self._initial) or any(
            a is not b for a, b in zip(initial, self._initial)
        ):
            self._initial = list(initial)
            self._states = [
                KeyedArray(np.shape(s), np.asarray(s).dtype, len(self._seen.data)) for s in initial
            ]
            self._seen.data[:] = False
        return self._states

    def __call__(self, rows: AgentRows) -> AgentRows:
        tables = self._tables()
        if not tables:
            return rows
        keys = np.asarray(rows["keys"], dtype=np.int64)
        self._seen.ensure(keys)
        starting = ~self._seen.data[keys]
        if "is_first" in rows:
            starting |= np.asarray(rows["is_first"], dtype=np.bool_)
        starting_keys = keys[starting]
        self._seen.data[starting_keys] = True
        for i, (table, initial) in enumerate(zip(tables, self._initial)):
            table.ensure(keys)
            table.data[starting_keys] = initial
            rows[f"state_in_{i}"] = table.data[keys]
        return rows

    def on_policy_output(self, output: ActionRows) -> None:
        tables = self._tables()
        if not tables:
            return
        keys = np.asarray(output.keys, dtype=np.int64)
        self._seen.ensure(keys)
        self._seen.data[keys] = True
        for table, state_out in zip(tables, output.state_outs):
            table.ensure(keys)
            table.data[keys] = np.asarray(state_out)
