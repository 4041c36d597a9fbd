"""User hooks at each episode event; every method is a no-op to override."""

from __future__ import annotations

from typing import Any


class Callbacks:
    """Subclass and override the events you care about.

    Every hook receives keyword arguments, among them ``runner``,
    ``base_env``, ``policies``, ``episode`` and ``env_index``; accept
    ``**kwargs`` so that later additions do not break you. The runner skips
    hooks that are not overridden, so an unused hook costs nothing per step.
    """

    def on_episode_created(self, **kwargs: Any) -> None:
        """The episode object exists; its sub-env is about to be reset."""

    def on_episode_start(self, **kwargs: Any) -> None:
        """The episode's first observations arrived."""

    def on_episode_step(self, **kwargs: Any) -> None:
        """The episode advanced one env step (not called on the reset round)."""

    def on_episode_end(self, **kwargs: Any) -> None:
        """The episode finished, or was dropped as faulty (``episode.faulty``)."""

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        """One agent's trajectory was post-processed; may edit ``postprocessed_batch`` in
        place. ``original_batches``, the other agents' trajectories, come from a copy of
        the policy batches made for this hook (their arrays as sampled; the dicts of their
        ``infos`` column are shared, read-only), so such edits do not show in them."""

    def on_sample_end(self, **kwargs: Any) -> None:
        """``sample()`` is about to return ``samples``."""


def overridden_hooks(callbacks: Callbacks) -> frozenset[str]:
    """Names of the hooks this callbacks object really implements."""
    return frozenset(
        name
        for name in vars(Callbacks)
        if name.startswith("on_") and getattr(type(callbacks), name) is not getattr(Callbacks, name)
    )
