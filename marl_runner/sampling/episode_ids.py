"""Episode ids that stay unique across runners, processes, clients and restarts."""

from __future__ import annotations

import secrets
from itertools import chain, repeat

# Ids are positive int64 values (the batches' ``eps_id`` column).
_MAX_ID = 2**63 - 1
# Room for this many episodes per runner before its ids would wrap.
_SPAN = 2**48


class EpisodeIds:
    """Hands out ``base + n``: a random base per instance, so ids never repeat within a
    runner and two runners (or one runner before and after a restart) collide only with
    negligible probability; not drawn from the config's seed, which runners may share."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        base = 1 + secrets.randbelow(_MAX_ID - _SPAN)
        # base, base + 1, ..., base + _SPAN - 1, then base again: each id made in C.
        self._ids = chain.from_iterable(repeat(range(base, base + _SPAN)))

    def next(self) -> int:
        """A fresh episode id in ``[1, 2**63 - 1]``."""
        return next(self._ids)
