"""Copies of env output that the env cannot change afterwards."""

from __future__ import annotations

from typing import Any

import numpy as np

_EMPTY_INFO: dict = {}


def owned_copy(value: Any) -> Any:
    """``value`` with its arrays copied and its dicts, lists and tuples rebuilt.

    Envs may write each step's obs into the same arrays, and keep the same info dicts:
    the output of a step that ends an episode is copied before the sub-env is reset
    (which would overwrite it while the runner still holds it). Mid-episode output needs
    no copy: the runner stacks a round's obs before the next step.
    """
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {key: owned_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [owned_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(owned_copy(item) for item in value)
    return value


def owned_infos(infos: dict) -> dict:
    """A step's infos as the batch may keep them: a copy of each agent's info dict, or
    one shared empty dict for each agent when every info is an empty dict (as the
    subprocess backend and the runner share theirs: read-only).

    The runner keeps a row's info dict in the batch, so an env that keeps its info
    dicts and changes them in place next step (or fills an empty one) would change the
    rows already sampled. The values in them are not copied (that would cost about a
    microsecond per agent per step); obs need no copy, they are stacked before the
    next step.
    """
    values = list(infos.values())
    try:
        if values.count(_EMPTY_INFO) == len(values):  # (None, 0 != {})
            return dict.fromkeys(infos, _EMPTY_INFO)
    except ValueError:  # an array info: `==` gives no one truth value
        pass
    try:
        return dict(zip(infos, map(dict.copy, values)))
    except TypeError:  # an info that is not a dict: kept as it is
        return {agent: dict(info) if isinstance(info, dict) else info for agent, info in infos.items()}
