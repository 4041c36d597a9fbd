"""Policy mapping functions used by the example configs.

Refer to them from a config as ``policy_mapping_fn: "examples.mappings:by_prefix"``
(run from the repository root so that ``examples`` is importable). Each has
the signature the runner calls: ``fn(agent_id, episode, **kwargs) -> policy_id``.
"""

from __future__ import annotations

import re
from typing import Any

_SEAT = re.compile(r"player_\d+")


def by_prefix(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """One policy per agent type: ``archer_0`` -> ``archer``, ``knight_1`` -> ``knight``."""
    return str(agent_id).split("_", 1)[0]


def by_seat(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """One policy per seat of a board game: ``player_0`` -> ``player_0``.

    Each seat learns its own strategy, since moving first and second are
    different games. Seats are named ``player_<n>`` (connect_four uses
    ``player_0``/``player_1``, tictactoe ``player_1``/``player_2``), so the
    policy ids in the config must be those names.
    """
    if not _SEAT.fullmatch(str(agent_id)):
        raise ValueError(f"by_seat expects agents named 'player_<n>', got {agent_id!r}")
    return str(agent_id)


def shared(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """Every agent plays one policy named ``shared`` (parameter sharing)."""
    return "shared"
