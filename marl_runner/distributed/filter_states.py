"""Observation-filter statistics of runners: read, merge exactly, install.

A filter is any agent connector with `pop_delta` (the statistics it saw
since its last sync) and a `state` param (the statistics it normalises
with), such as `MeanStdObservationFilterAgentConnector`. Filters are keyed
`(policy_id, position in the agent connector pipeline)`; every runner of a
group is built from one config, so the keys agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from connectors import MeanStdObservationFilterAgentConnector

FilterKey = tuple[str, int]
FilterStates = dict[FilterKey, dict[str, Any]]


def _filters(runner: Any) -> Iterable[tuple[FilterKey, Any]]:
    for policy_id, policy in runner.policy_map.items():
        for index, connector in enumerate(policy.agent_connectors or ()):
            if hasattr(connector, "pop_delta"):
                yield (policy_id, index), connector


def pop_filter_deltas(runner: Any) -> FilterStates:
    """What each filter of `runner` saw since the last sync (and start a new delta)."""
    return {key: connector.pop_delta() for key, connector in _filters(runner)}


def read_filter_states(runner: Any) -> FilterStates:
    """The statistics each filter normalises with, from `runner.get_state()`."""
    state = runner.get_state()
    states = {}
    for policy_id, index in dict(_filters(runner)):
        _, params = state[policy_id]["agent_connectors"][index]
        if params.get("state") is not None:
            states[(policy_id, index)] = params["state"]
    return states


def install_filter_states(runner: Any, states: Mapping[FilterKey, Mapping[str, Any]]) -> None:
    """Make `runner`'s filters normalise with `states` (through `runner.set_state`),
    keeping its weights and running episodes."""
    if not states:
        return
    state = runner.get_state()
    for (policy_id, index), stats in states.items():
        chain = list(state[policy_id]["agent_connectors"])
        name, params = chain[index]
        chain[index] = (name, {**params, "state": stats})
        state[policy_id]["agent_connectors"] = chain
    runner.set_state(state)


def merge_filter_states(base: FilterStates, deltas: Iterable[FilterStates]) -> FilterStates:
    """`base` plus every runner's delta: the exact statistics of all the data pooled."""
    parts: dict[FilterKey, list[Mapping[str, Any]]] = {key: [stats] for key, stats in base.items()}
    for delta in deltas:
        for key, stats in delta.items():
            parts.setdefault(key, []).append(stats)
    return {
        key: MeanStdObservationFilterAgentConnector.merge_states(states)
        for key, states in parts.items()
    }
