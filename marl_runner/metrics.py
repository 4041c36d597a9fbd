"""Per-episode metric records, phase timings, and the summary ``get_metrics()`` returns."""

from __future__ import annotations

import time
from collections import defaultdict
from time import perf_counter
from typing import Any, NamedTuple

import numpy as np

# How many fault messages ``get_metrics()["faults"]`` keeps (the most recent).
MAX_REPORTED_FAULTS = 10
PHASES = ("raw_obs_processing", "inference", "action_processing", "env_wait", "env_render")

#: The runner step's steps (docs/DESIGN.md), in order, and the phase each one is reported under.
STEP_PHASES = {
    "poll": "env_wait",
    "collect": "raw_obs_processing",
    "agent_connectors": "raw_obs_processing",
    "forward": "inference",
    "action_connectors": "action_processing",
    "store": "action_processing",
    "send": "env_wait",
    "build_fragments": "action_processing",
}


class RolloutMetrics(NamedTuple):
    """What one finished (or faulty) episode reports."""

    episode_length: int
    episode_reward: float
    agent_rewards: dict
    custom_metrics: dict
    perf_stats: dict
    hist_data: dict
    media: dict
    connector_metrics: dict
    episode_faulty: bool = False

    @classmethod
    def of_episode(cls, episode: Any, perf_stats: dict | None = None) -> RolloutMetrics:
        """The record of an ended episode; a faulty one reports no rewards."""
        faulty = episode.faulty
        agent_rewards = {} if faulty else episode.agent_rewards
        # Positional, in field order: made once per episode, and keywords cost more.
        return cls._make((
            episode.length,
            float(sum(agent_rewards.values())),
            agent_rewards,
            dict(episode.custom_metrics),
            perf_stats or {},
            dict(episode.hist_data),
            dict(episode.media),
            {},
            faulty,
        ))


class PerfStats:
    """Milliseconds per runner step for each phase: global mean or EMA.

    With ``ema_coef`` set, recent steps weigh more, which tracks changes in
    a long run; without it every step counts the same.
    """

    def __init__(self, ema_coef: float | None = None) -> None:
        self.ema_coef = ema_coef
        self.num_steps = 0
        self._totals = dict.fromkeys(PHASES, 0.0)
        self._ema = dict.fromkeys(PHASES, 0.0)
        # What ``get`` returned since the last step (every episode ending in a round asks).
        self._last: dict[str, float] | None = None

    def record_step(self, seconds_by_step: dict[str, float]) -> None:
        """One runner step's timings keyed by step name (``STEP_PHASES``), added as phases."""
        current = dict.fromkeys(PHASES, 0.0)
        for step, seconds in seconds_by_step.items():
            current[STEP_PHASES[step]] += seconds
        self.num_steps += 1
        self._last = None
        for phase, seconds in current.items():
            if self.ema_coef is None:
                self._totals[phase] += seconds
            elif self.num_steps == 1:
                self._ema[phase] = seconds
            else:
                self._ema[phase] = (1 - self.ema_coef) * self._ema[phase] + self.ema_coef * seconds

    def get(self) -> dict[str, float]:
        """``mean_<phase>_ms`` for every phase: the mean over steps, or the EMA (a copy)."""
        if self._last is None:
            if self.ema_coef is None:
                steps = max(self.num_steps, 1)
                values = {p: s / steps for p, s in self._totals.items()}
            else:
                values = self._ema
            self._last = {f"mean_{phase}_ms": values[phase] * 1000.0 for phase in PHASES}
        return dict(self._last)


class StepTimer:
    """Seconds per named step of one runner step: ``lap(name)`` ends the step ``name``."""

    __slots__ = ("seconds", "_last")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = perf_counter()

    def lap(self, step: str) -> None:
        """Ends step ``step``: its seconds are the time since the previous lap."""
        now = perf_counter()
        self.seconds[step] = now - self._last
        self._last = now


class MetricsCollector:
    """Accumulates episode records and step counts between ``get_metrics()`` calls."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.episodes: list[RolloutMetrics] = []
        self.num_env_steps = 0
        self.num_agent_steps = 0
        self.num_late_rewards = 0
        self.num_sub_env_restarts = 0
        self.faults: list[str] = []
        self.since = time.perf_counter()

    def add_episode(self, record: RolloutMetrics, num_late_rewards: int = 0) -> None:
        """Keeps one episode's record until the next ``summary``."""
        self.episodes.append(record)
        self.num_late_rewards += num_late_rewards

    def add_fault(self, env_id: int, error: BaseException) -> None:
        """Why a sub-env's episode was dropped; the last few are reported."""
        self.faults.append(f"sub-env {env_id}: {type(error).__name__}: {error}")
        del self.faults[:-MAX_REPORTED_FAULTS]

    def summary(self, perf: dict[str, float], connector_metrics: dict) -> dict[str, Any]:
        """The metrics since the last call; resets the counters."""
        elapsed = max(time.perf_counter() - self.since, 1e-9)
        good = [e for e in self.episodes if not e.episode_faulty]
        policy_rewards: dict[str, list[float]] = defaultdict(list)
        custom: dict[str, list[float]] = defaultdict(list)
        for episode in good:
            per_policy: dict[str, float] = defaultdict(float)
            for (_agent, policy_id), reward in episode.agent_rewards.items():
                per_policy[policy_id] += reward
            for policy_id, reward in per_policy.items():
                policy_rewards[policy_id].append(reward)
            for name, value in episode.custom_metrics.items():
                custom[name].append(value)
        metrics = {
            "episodes": len(good),
            "episode_reward_mean": _mean([e.episode_reward for e in good]),
            "episode_reward_min": _min([e.episode_reward for e in good]),
            "episode_reward_max": _max([e.episode_reward for e in good]),
            "episode_len_mean": _mean([e.episode_length for e in good]),
            "policy_reward_mean": {p: float(np.mean(r)) for p, r in policy_rewards.items()},
            "custom_metrics": {k: float(np.mean(v)) for k, v in custom.items()},
            "num_faulty_episodes": len(self.episodes) - len(good),
            "num_late_rewards": self.num_late_rewards,
            "num_sub_env_restarts": self.num_sub_env_restarts,
            "faults": list(self.faults),
            "num_env_steps": self.num_env_steps,
            "num_agent_steps": self.num_agent_steps,
            "env_steps_per_s": self.num_env_steps / elapsed,
            "agent_steps_per_s": self.num_agent_steps / elapsed,
            "perf": perf,
            "connector_metrics": connector_metrics,
        }
        self._reset()
        return metrics


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _min(values: list[float]) -> float:
    return float(np.min(values)) if values else float("nan")


def _max(values: list[float]) -> float:
    return float(np.max(values)) if values else float("nan")
