"""The env's global state (PettingZoo's ``state()``) as an ``env_state`` column, for
centralised critics (MAPPO and the like)."""

from __future__ import annotations

from typing import Any

import numpy as np

from connectors.agent.keyed import KeyedArray
from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentRows
from connectors.errors import ConnectorError

#: The info key under which an env hands each agent the env's global state. The PettingZoo
#: wrappers put ``env.state()`` there with ``env.capture_state: true``; a MultiAgentEnv of
#: one's own may do the same to get an ``env_state`` column.
ENV_STATE_INFO_KEY = "__env_state__"


class EnvStateAgentConnector(AgentConnector):
    """Moves the env's global state out of each row's infos into an ``env_state`` column.

    The state is computed where the env runs (sync, a subprocess worker, a
    Ray actor) and travels with the agents' infos; this connector lifts it out,
    so later connectors, the policy and the stored ``infos`` column never see
    the key. With ``env.capture_state: true`` the runner puts it first in every
    policy's agent chain. It is not part of the observation: the policy's model
    does not read it, a centralised critic does. In a batch, ``env_state`` is
    the state when the row's ``obs`` was seen and ``new_env_state`` the one
    with its ``new_obs``.

    A row without a state of its own (the fake final obs of an agent that
    ended without one) gets the episode's last state: the latest one this
    policy's rows saw in that sub-env.

    Reads: ``infos``, ``env_ids``, ``is_first``. Writes: ``env_state``; ``infos``
    without the key.
    """

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._last: KeyedArray | None = None  # per sub-env: the latest state seen there
        self._seen = KeyedArray((), np.bool_)

    def __call__(self, rows: AgentRows) -> AgentRows:
        if not len(rows):
            return rows
        states = [
            info.pop(ENV_STATE_INFO_KEY, None) if isinstance(info, dict) and info else None
            for info in rows["infos"]
        ]
        env_ids = np.asarray(rows["env_ids"], dtype=np.int64)
        present = np.array([i for i, state in enumerate(states) if state is not None], np.int64)
        stacked = self._stack([states[i] for i in present.tolist()], rows) if len(present) else None
        if "is_first" in rows:
            first = np.asarray(rows["is_first"], dtype=np.bool_)[present]
        else:
            first = np.zeros(len(present), np.bool_)
        # An ending episode's rows come before the next episode's first rows of that sub-env.
        if stacked is not None:
            self._remember(stacked[~first], env_ids[present[~first]])
        if len(present) == len(states):
            column = stacked
        else:
            column = self._fill_missing(len(states), present, stacked, env_ids, rows)
        if stacked is not None:
            self._remember(stacked[first], env_ids[present[first]])
        rows["env_state"] = column
        return rows

    def _stack(self, states: list[Any], rows: AgentRows) -> np.ndarray:
        try:
            return np.stack([np.asarray(state) for state in states])
        except ValueError as err:
            shapes = sorted({np.shape(state) for state in states})
            raise ConnectorError(
                f"EnvStateAgentConnector: the env states of one round do not stack into one "
                f"array (shapes {shapes} in sub-envs {sorted(set(rows['env_ids'].tolist()))}): "
                f"{err}; expected state() to return arrays of one shape"
            ) from None

    def _fill_missing(
        self,
        num_rows: int,
        present: np.ndarray,
        stacked: np.ndarray | None,
        env_ids: np.ndarray,
        rows: AgentRows,
    ) -> np.ndarray:
        """Rows without a state take their sub-env's latest one (fake final obs rows)."""
        missing = np.setdiff1d(np.arange(num_rows), present)
        table = self._last
        seen = np.zeros(len(missing), np.bool_)
        if table is not None:
            self._seen.ensure(env_ids)
            seen = self._seen.data[env_ids[missing]]
        if table is None or not seen.all():
            row = int(missing[np.flatnonzero(~seen)[0]])
            raise ConnectorError(
                f"EnvStateAgentConnector: the row of agent {rows['agent_ids'][row]!r} in sub-env "
                f"{int(env_ids[row])} has no env state under the info key "
                f"{ENV_STATE_INFO_KEY!r}, and no earlier row there had one; expected "
                "env.capture_state: true (the PettingZoo wrapper then adds env.state() to every "
                "agent's infos) or an env that puts the state there itself"
            )
        table.ensure(env_ids)
        column = np.empty((num_rows, *table.data.shape[1:]), table.data.dtype)
        column[missing] = table.data[env_ids[missing]]
        if stacked is not None:
            column[present] = stacked
        return column

    def _remember(self, states: np.ndarray, env_ids: np.ndarray) -> None:
        if not len(env_ids):
            return
        if self._last is None:
            self._last = KeyedArray(states.shape[1:], states.dtype)
        self._last.ensure(env_ids)
        self._seen.ensure(env_ids)
        try:
            self._last.data[env_ids] = states
        except ValueError as err:
            raise ConnectorError(
                f"EnvStateAgentConnector: env state of shape {states.shape[1:]} where earlier "
                f"rounds had {self._last.data.shape[1:]} ({err}); expected state() to keep "
                "one shape"
            ) from None
        self._seen.data[env_ids] = True
