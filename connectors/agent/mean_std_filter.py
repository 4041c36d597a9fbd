"""Running mean/std observation normalisation, mergeable across runners."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentRows
from connectors.errors import ConnectorError


@dataclass(frozen=True)
class RunningStats:
    """Count, mean and sum of squared deviations (M2) of a set of observations.

    Two disjoint sets merge exactly with the parallel-variance formula
    (Chan et al.), so statistics gathered by several runners combine into
    the statistics of the union.
    """

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> RunningStats:
        """No observations yet: the identity of ``merge``, so a filter starts from it."""
        return cls(0, np.zeros(shape), np.zeros(shape))

    @classmethod
    def of_batch(cls, x: np.ndarray) -> RunningStats:
        """Statistics of the rows of ``x`` (first dim = samples)."""
        shape = x.shape[1:]
        flat = x.reshape(len(x), -1).astype(np.float64)
        mean = flat.mean(axis=0)
        deviation = flat - mean
        # einsum on 2-D is ~10x faster than square().sum(axis=0) on n-D arrays.
        m2 = np.einsum("ij,ij->j", deviation, deviation)
        return cls(len(x), mean.reshape(shape), m2.reshape(shape))

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> RunningStats:
        """Inverse of ``to_dict``: restores a filter from a checkpoint or another runner's state,
        rejecting a malformed one here rather than at the first normalised round."""
        try:
            stats = cls(
                int(state["count"]),
                np.asarray(state["mean"], dtype=np.float64),
                np.asarray(state["m2"], dtype=np.float64),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConnectorError(
                f"filter state must be a dict with 'count', 'mean' and 'm2', got {state!r} ({err})"
            ) from None
        if stats.mean.shape != stats.m2.shape or stats.count < 0:
            raise ConnectorError(f"filter state has mismatched or negative entries: {state!r}")
        return stats

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (float64 -> Python float is exact)."""
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    def merge(self, other: RunningStats) -> RunningStats:
        """Statistics of the union of two disjoint sets, exactly: how several runners' filters
        combine into one without keeping their observations."""
        if other.mean.shape != self.mean.shape:
            raise ConnectorError(
                f"cannot merge filter statistics of shapes {self.mean.shape} and {other.mean.shape}"
            )
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + np.square(delta) * (self.count * other.count / count)
        return RunningStats(count, mean, m2)

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation (zeros while there are no samples)."""
        return np.sqrt(self.m2 / self.count) if self.count else np.zeros_like(self.m2)


class MeanStdObservationFilterAgentConnector(AgentConnector):
    """Normalises observations to ``(obs - mean) / std`` with running statistics.

    In training every round's observations update the statistics first (then
    the round is normalised with them); in eval (``in_eval()``) they are
    frozen. Features whose std is below ``epsilon`` are only centred. The
    output is clipped to ``[-clip, clip]`` unless ``clip`` is None. Needs a
    Box observation space: put ``ObsPreprocessorConnector`` before it for
    anything else.

    Syncing runners: the driver keeps the global statistics; each round it
    does ``merged = merge_states([global] + [f.pop_delta() for f in runner
    filters])`` and ``f.set_state(merged)`` everywhere. ``pop_delta`` returns
    only what a runner saw since its last sync, so nothing is counted twice.

    Reads and writes: ``obs``.
    """

    def __init__(
        self,
        ctx: ConnectorContext,
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(ctx)
        self.clip = None if clip is None else float(clip)
        self.epsilon = float(epsilon)
        self._stats = None if state is None else RunningStats.from_dict(state)
        self._delta: RunningStats | None = None
        self._shift: np.ndarray | None = None
        self._scale: np.ndarray | None = None

    def params(self) -> dict[str, Any]:
        return {"clip": self.clip, "epsilon": self.epsilon, "state": self.get_state()}

    def __repr__(self) -> str:
        count = self._stats.count if self._stats is not None else 0
        return f"{type(self).__name__}(clip={self.clip!r}, epsilon={self.epsilon!r}, count={count})"

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        if not isinstance(space, gym.spaces.Box):
            raise ConnectorError(
                f"MeanStdObservationFilterAgentConnector needs a Box observation space, got {space}"
            )
        if self._stats is not None and self._stats.mean.shape != space.shape:
            raise ConnectorError(
                f"MeanStdObservationFilterAgentConnector: its statistics have shape "
                f"{self._stats.mean.shape} but the observation space is {space}"
            )
        bound = np.inf if self.clip is None else self.clip
        return gym.spaces.Box(-bound, bound, shape=space.shape, dtype=np.float32)

    def bind_input_space(self, space: gym.Space) -> gym.Space:
        out = super().bind_input_space(space)
        if self._stats is None:
            self._stats = RunningStats.empty(space.shape)
        if self._delta is None:  # a re-bind (chain edit) must not lose the unsynced delta
            self._delta = RunningStats.empty(space.shape)
        self._refresh_normaliser()
        return out

    def _refresh_normaliser(self) -> None:
        std = self._stats.std
        self._shift = self._stats.mean.astype(np.float32)
        self._scale = np.where(std > self.epsilon, 1.0 / np.maximum(std, self.epsilon), 1.0).astype(
            np.float32
        )

    def __call__(self, rows: AgentRows) -> AgentRows:
        if self._delta is None:
            self.bind_input_space(self.input_observation_space)
        obs = np.asarray(rows["obs"], dtype=np.float32)
        if obs.shape[1:] != self._shift.shape:
            raise ConnectorError(
                f"MeanStdObservationFilterAgentConnector: expected observations of shape "
                f"{self._shift.shape}, got rows of shape {obs.shape[1:]}"
            )
        if self.is_training and len(obs):
            batch = RunningStats.of_batch(obs)
            self._stats = self._stats.merge(batch)
            self._delta = self._delta.merge(batch)
            self._refresh_normaliser()
        normalised = (obs - self._shift) * self._scale
        if self.clip is not None:
            np.clip(normalised, -self.clip, self.clip, out=normalised)
        rows["obs"] = normalised
        return rows

    def get_state(self) -> dict[str, Any] | None:
        """The statistics used for normalising (None before the input space is known)."""
        return None if self._stats is None else self._stats.to_dict()

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace the statistics (e.g. with merged ones) and start a new delta."""
        stats = RunningStats.from_dict(state)
        if self._stats is not None and stats.mean.shape != self._stats.mean.shape:
            raise ConnectorError(
                f"MeanStdObservationFilterAgentConnector: state of shape {stats.mean.shape} "
                f"does not fit statistics of shape {self._stats.mean.shape}"
            )
        self._stats = stats
        self._delta = RunningStats.empty(stats.mean.shape)
        self._refresh_normaliser()

    def can_update_from(self, params: Mapping[str, Any]) -> bool:
        """True when only the statistics differ (same ``clip`` and ``epsilon``)."""
        try:
            clip = params.get("clip", 10.0)
            same = (None if clip is None else float(clip)) == self.clip and float(
                params.get("epsilon", 1e-8)
            ) == self.epsilon
            state = params.get("state")
            if state is not None:
                stats = RunningStats.from_dict(state)
                if self._stats is not None and stats.mean.shape != self._stats.mean.shape:
                    return False
        except (AttributeError, ConnectorError, TypeError, ValueError):
            return False
        return same and set(params) <= {"clip", "epsilon", "state"}

    def update_from(self, params: Mapping[str, Any]) -> None:
        """Takes the statistics over (as ``set_state``); ``state: None`` empties them."""
        state = params.get("state")
        if state is not None:
            self.set_state(state)
        elif self._stats is not None:
            self.set_state(RunningStats.empty(self._stats.mean.shape).to_dict())

    def pop_delta(self) -> dict[str, Any]:
        """Statistics of what this filter saw since the last ``set_state``/``pop_delta``."""
        if self._delta is None:
            self.bind_input_space(self.input_observation_space)
        delta = self._delta
        self._delta = RunningStats.empty(delta.mean.shape)
        return delta.to_dict()

    @staticmethod
    def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Exact statistics of the union of disjoint sets of observations."""
        merged: RunningStats | None = None
        for state in states:
            stats = RunningStats.from_dict(state)
            merged = stats if merged is None else merged.merge(stats)
        if merged is None:
            raise ConnectorError("merge_states needs at least one state")
        return merged.to_dict()
