"""The policy contract the runner drives: batched rows in, actions out."""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from marl_runner.batch import SampleBatch

__all__ = ["EpisodeView", "Policy", "PolicyOutput"]


class EpisodeView(Protocol):
    """What a policy may read of the episode a trajectory comes from (the runner passes
    its ``MultiAgentEpisode``); a Protocol, so that policies never import the sampling loop."""

    episode_id: int
    env_id: int
    length: int
    user_data: dict[str, Any]

PolicyOutput = tuple[Any, list[np.ndarray], dict[str, np.ndarray]]
"""``(actions, state_outs, extra)``: every array has one row per input row."""


class Policy(abc.ABC):
    """Maps a batch of per-agent inputs to actions; one instance per policy id.

    Only :meth:`compute_actions_from_input_dict` must be written; the other
    methods default to a stateless, feed-forward policy without weights.

    Attributes:
        observation_space: the policy's *input* space, i.e. what the agent
            connector pipeline outputs (usually a flat Box), not the env's.
        action_space: the space of the raw actions this policy returns.
        config: the policy's config dict.
        agent_connectors / action_connectors: the pipelines the runner built
            for this policy (None until the runner sets them).
        view_requirements: extra input columns the policy wants the agent
            connectors to provide, e.g. ``{"prev_actions": {...}}``; taken
            from ``config["view_requirements"]`` (default: none).
        policy_version: how many times weights were loaded (``set_weights``,
            also through ``set_state``), from 0; the runner stores it with
            every row as ``policy_version``, the version that chose the action.
    """

    policy_version: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``set_weights`` bumps ``policy_version`` too (once per call,
        also when it calls ``super().set_weights``)."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("set_weights")
        if own is not None and not getattr(own, "_bumps_version", False):
            cls.set_weights = _bumping_version(own)  # type: ignore[method-assign]

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.config: dict[str, Any] = dict(config or {})
        self.agent_connectors: Any = None
        self.action_connectors: Any = None
        self.view_requirements: dict[str, dict[str, Any]] = dict(
            self.config.get("view_requirements") or {}
        )

    @abc.abstractmethod
    def compute_actions_from_input_dict(
        self,
        input_dict: Mapping[str, Any],
        explore: bool | None = None,
        timestep: int | None = None,
    ) -> PolicyOutput:
        """Actions for every row of ``input_dict`` in one batched call.

        ``input_dict`` holds ``obs`` ``[n, ...]`` and, when the connectors
        provide them, ``action_mask`` ``[n, A]`` (1 = allowed),
        ``state_in_0..k``, ``prev_actions``, ``prev_rewards``. Returns
        ``(actions, state_outs, extra)``, all numpy with first dim n.
        """

    def get_initial_state(self) -> list[np.ndarray]:
        """Recurrent state of a fresh agent, one array per state tensor (shape of one row)."""
        return []

    def num_state_tensors(self) -> int:
        """How many recurrent state arrays each row carries (0: feed-forward)."""
        return len(self.get_initial_state())

    def is_recurrent(self) -> bool:
        """Whether the policy carries state from one row of an agent to its next."""
        return self.num_state_tensors() > 0

    def get_weights(self) -> dict[str, np.ndarray]:
        """Trainable parameters as numpy arrays, to ship to other runners."""
        return {}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Loads what :meth:`get_weights` returned; a policy without weights accepts only ``{}``.
        Each call bumps ``policy_version``."""
        if weights:
            raise ValueError(
                f"{type(self).__name__} has no weights, got weights named {sorted(weights)}"
            )

    def get_state(self) -> dict[str, Any]:
        """Everything needed to restore this policy: weights plus any other state."""
        return {"weights": self.get_weights()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`get_state` returned."""
        self.set_weights(state["weights"])

    def score_logged_actions(
        self, outputs: Mapping[str, Any], rows: np.ndarray, actions: np.ndarray
    ) -> np.ndarray | None:
        """Log-probs ``[len(rows)]`` of ``actions``, which an external env chose for
        ``rows`` of a round (``log_action``), from the policy's ``outputs`` for the round
        (its extra outputs, e.g. the distribution inputs). The runner stores them as those
        rows' ``action_logp``; None (the default): the policy cannot tell, and they are
        stored as NaN."""
        return None

    def wants_postprocessing(self) -> bool:
        """Whether ``postprocess_trajectory`` does anything; if not, the runner skips
        splitting batches into trajectories for it."""
        return type(self).postprocess_trajectory is not Policy.postprocess_trajectory

    def postprocess_trajectory(
        self,
        batch: SampleBatch,
        other_agent_batches: Mapping[Any, Any] | None = None,
        episode: EpisodeView | None = None,
    ) -> SampleBatch:
        """Adds training columns (e.g. advantages) to one agent's trajectory; default: none."""
        return batch


def _bumping_version(set_weights: Callable[..., None]) -> Callable[..., None]:
    """``set_weights`` that adds one to ``policy_version`` after the outermost call succeeds."""

    @functools.wraps(set_weights)
    def wrapper(self: Policy, weights: Mapping[str, np.ndarray]) -> None:
        if self.__dict__.get("_loading_weights"):
            set_weights(self, weights)  # a super() call inside another set_weights
            return
        self._loading_weights = True
        try:
            set_weights(self, weights)
        finally:
            self._loading_weights = False
        self.policy_version += 1

    wrapper._bumps_version = True  # type: ignore[attr-defined]
    return wrapper


Policy.set_weights = _bumping_version(Policy.set_weights)  # type: ignore[method-assign]
