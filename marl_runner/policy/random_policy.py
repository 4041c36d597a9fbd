"""Uniformly random actions: a baseline, and a policy for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from marl_runner.policy.action_spaces import check_action_mask, multidiscrete_layout
from marl_runner.policy.base import Policy, PolicyOutput

__all__ = ["RandomPolicy"]


class RandomPolicy(Policy):
    """Draws each action uniformly from the action space, or among the allowed ones.

    Handles Discrete, MultiDiscrete (an ``action_mask`` restricts both),
    MultiBinary and Box (uniform within finite bounds; like gymnasium's
    ``Box.sample``, normal / shifted exponential along unbounded sides).
    Config ``seed`` seeds a private numpy Generator. The observation space is
    not used. Returns no state and an empty extra dict: there is no
    distribution worth logging, and no column a trainer could use.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, config)
        if not isinstance(
            action_space,
            gym.spaces.Discrete
            | gym.spaces.MultiDiscrete
            | gym.spaces.MultiBinary
            | gym.spaces.Box,
        ):
            raise ValueError(
                "RandomPolicy supports Discrete, MultiDiscrete, MultiBinary and Box action "
                f"spaces, got {action_space}"
            )
        self._rng = np.random.default_rng(self.config.get("seed"))

    def compute_actions_from_input_dict(
        self,
        input_dict: Mapping[str, Any],
        explore: bool | None = None,
        timestep: int | None = None,
    ) -> PolicyOutput:
        """Random actions for every row; reads only ``len(obs)`` and ``action_mask``."""
        num_rows = len(input_dict["obs"])
        if "action_mask" in input_dict:
            allowed = check_action_mask(input_dict["action_mask"], self.action_space, num_rows)
            actions = self._masked_choice(allowed, num_rows)
        else:
            actions = self._sample(num_rows)
        return actions.astype(self.action_space.dtype, copy=False), [], {}

    def get_state(self) -> dict[str, Any]:
        """No weights; the generator state, so that a restored policy draws the same actions."""
        return {"weights": {}, "rng_state": self._rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores the generator, so that the same actions follow."""
        if "rng_state" in state:
            self._rng.bit_generator.state = state["rng_state"]

    def _masked_choice(self, allowed: np.ndarray, num_rows: int) -> np.ndarray:
        """Uniform among allowed entries: the argmax of iid uniforms restricted to them."""
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            scores = np.where(allowed, self._rng.random(allowed.shape), -1.0)
            return scores.argmax(axis=1) + space.start
        layout = multidiscrete_layout(space)
        padded_allowed = allowed[:, layout.gather_index] & layout.valid
        scores = np.where(padded_allowed, self._rng.random(padded_allowed.shape), -1.0)
        choice = scores.argmax(axis=2) + layout.start
        return choice.reshape(num_rows, *space.shape)

    def _sample(self, num_rows: int) -> np.ndarray:
        space = self.action_space
        rng = self._rng
        if isinstance(space, gym.spaces.Discrete):
            return rng.integers(space.n, size=num_rows) + space.start
        if isinstance(space, gym.spaces.MultiDiscrete):
            return rng.integers(space.nvec, size=(num_rows, *space.shape)) + space.start
        if isinstance(space, gym.spaces.MultiBinary):
            return rng.integers(2, size=(num_rows, *space.shape))
        return self._sample_box(space, num_rows)

    def _sample_box(self, space: gym.spaces.Box, num_rows: int) -> np.ndarray:
        shape = (num_rows, *space.shape)
        low = np.broadcast_to(space.low, space.shape).astype(np.float64)
        high = np.broadcast_to(space.high, space.shape).astype(np.float64)
        if np.issubdtype(space.dtype, np.integer):
            return self._rng.integers(
                low.astype(np.int64), high.astype(np.int64), size=shape, endpoint=True
            )
        lower_bounded, upper_bounded = np.isfinite(low), np.isfinite(high)
        if lower_bounded.all() and upper_bounded.all():
            return self._rng.uniform(low, high, size=shape)
        finite_low, finite_high = (
            np.where(lower_bounded, low, 0.0),
            np.where(upper_bounded, high, 0.0),
        )
        uniform = self._rng.uniform(finite_low, finite_high, size=shape)
        normal = self._rng.standard_normal(shape)
        exponential = self._rng.standard_exponential(shape)
        return np.select(
            [lower_bounded & upper_bounded, lower_bounded, upper_bounded],
            [uniform, finite_low + exponential, finite_high - exponential],
            default=normal,
        )
