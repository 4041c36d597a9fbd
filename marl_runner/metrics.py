"""Per-episode metric records, phase timings, and the summary ``get_metrics()`` returns."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from time import perf_counter
from typing import Any, NamedTuple

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
    """Adds up episode records and step counts between ``get_metrics()`` calls.

    Records are folded into sums as they come, not kept: a server or a long
    run that nobody asks for metrics (no metrics log) stays at constant memory.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.num_episodes = 0  # good ones; faulty ones are counted apart
        self.num_faulty_episodes = 0
        self._reward_sum = self._length_sum = 0.0
        self._reward_min, self._reward_max = math.inf, -math.inf
        # name -> [sum, count]: a policy's reward per episode it took part in; custom metrics.
        self._policy_rewards: dict[str, list[float]] = {}
        self._custom: dict[str, list[float]] = {}
        self.num_env_steps = 0
        self.num_agent_steps = 0
        self.num_late_rewards = 0
        self.num_sub_env_restarts = 0
        self.faults: list[str] = []
        self.since = time.perf_counter()

    def add_episode(self, record: RolloutMetrics, num_late_rewards: int = 0) -> None:
        """Adds one episode's record to the sums of the next ``summary``."""
        self.num_late_rewards += num_late_rewards
        if record.episode_faulty:
            self.num_faulty_episodes += 1
            return
        self.num_episodes += 1
        reward = record.episode_reward
        self._reward_sum += reward
        self._reward_min = min(self._reward_min, reward)
        self._reward_max = max(self._reward_max, reward)
        self._length_sum += record.episode_length
        per_policy: dict[str, float] = defaultdict(float)
        for (_agent, policy_id), agent_reward in record.agent_rewards.items():
            per_policy[policy_id] += agent_reward
        for sums, items in ((self._policy_rewards, per_policy), (self._custom, record.custom_metrics)):
            for name, value in items.items():
                entry = sums.setdefault(name, [0.0, 0])
                entry[0] += value
                entry[1] += 1

    def add_fault(self, env_id: int, error: BaseException) -> None:
        """Why a sub-env's episode was dropped; the last few are reported."""
        self.faults.append(f"sub-env {env_id}: {type(error).__name__}: {error}")
        del self.faults[:-MAX_REPORTED_FAULTS]

    def summary(self, perf: dict[str, float], connector_metrics: dict) -> dict[str, Any]:
        """The metrics since the last call; resets the counters."""
        elapsed = max(time.perf_counter() - self.since, 1e-9)
        episodes = self.num_episodes
        nan = float("nan")
        metrics = {
            "episodes": episodes,
            "episode_reward_mean": self._reward_sum / episodes if episodes else nan,
            "episode_reward_min": float(self._reward_min) if episodes else nan,
            "episode_reward_max": float(self._reward_max) if episodes else nan,
            "episode_len_mean": self._length_sum / episodes if episodes else nan,
            "policy_reward_mean": {p: float(s / n) for p, (s, n) in self._policy_rewards.items()},
            "custom_metrics": {k: float(s / n) for k, (s, n) in self._custom.items()},
            "num_faulty_episodes": self.num_faulty_episodes,
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
