"""Episode ids that stay unique across runners, processes, clients and restarts."""

from __future__ import annotations

import secrets

# Ids are positive int64 values (the batches' ``eps_id`` column).
_MAX_ID = 2**63 - 1
# Room for this many episodes per runner before its ids would wrap.
_SPAN = 2**48


class EpisodeIds:
    """Hands out ``base + n``: a random base per instance, so ids never repeat within a
    runner and two runners (or one runner before and after a restart) collide only with
    negligible probability; not drawn from the config's seed, which runners may share."""

    __slots__ = ("_base", "_count")

    def __init__(self) -> None:
        self._base = 1 + secrets.randbelow(_MAX_ID - _SPAN)
        self._count = 0

    def next(self) -> int:
        """A fresh episode id in ``[1, 2**63 - 1]``."""
        episode_id = self._base + self._count
        self._count = (self._count + 1) % _SPAN
        return episode_id
