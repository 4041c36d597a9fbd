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
    """A step's infos as the batch may keep them: one shared, read-only empty dict
    for each agent when every info is an empty dict, else copied (see ``owned_copy``).

    The runner keeps a row's info dict in the batch, so an env that keeps its info
    dicts and changes them in place next step (or fills an empty one) would change the
    rows already sampled; obs need no such copy, they are stacked before the next step.
    """
    try:
        all_empty = list(infos.values()).count(_EMPTY_INFO) == len(infos)  # (None, 0 != {})
    except ValueError:  # an array info: `==` gives no one truth value
        all_empty = False
    return dict.fromkeys(infos, _EMPTY_INFO) if all_empty else owned_copy(infos)
