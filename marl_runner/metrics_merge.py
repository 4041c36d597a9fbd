"""One metrics dict from the metrics of many samples of many runners: a runner group
merges its runners', and a metrics log its intervals' (the bottom floor: no imports of
marl_runner)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

_SUMMED = ("episodes",)
_PER_SECOND = {"env_steps_per_s": "num_env_steps", "agent_steps_per_s": "num_agent_steps"}
_PER_EPISODE_DICTS = ("policy_reward_mean", "custom_metrics")


def merge_metrics(parts: Sequence[dict[str, Any]], elapsed_s: float) -> dict[str, Any]:
    """Counts summed, episode means weighted by episodes, min/max over all, rates
    over `elapsed_s` of wall time (runners sample in parallel), perf times averaged."""
    merged: dict[str, Any] = {}
    episodes = [part.get("episodes", 0) or 0 for part in parts]
    keys = {key for part in parts for key in part}
    for key in keys:
        values = [part[key] for part in parts if key in part]
        if key in _PER_SECOND or key == "connector_metrics":
            continue
        if key in _PER_EPISODE_DICTS:
            merged[key] = _weighted_dicts(parts, key, episodes)
        elif key == "perf":
            merged[key] = _mean_dicts(values)
        elif key in _SUMMED or key.startswith("num_"):
            merged[key] = sum(values)
        elif key.endswith("_min"):
            merged[key] = _nan_reduce(min, values)
        elif key.endswith("_max"):
            merged[key] = _nan_reduce(max, values)
        elif key.endswith("_mean"):
            merged[key] = _weighted([part.get(key) for part in parts], episodes)
        else:
            merged[key] = values[-1]
    for rate, count in _PER_SECOND.items():
        merged[rate] = merged.get(count, 0) / max(elapsed_s, 1e-9)
    return merged


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def _weighted(values: Sequence[Any], weights: Sequence[float]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights) if _finite(v) and w > 0]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")


def _nan_reduce(reduce: Any, values: Sequence[Any]) -> float:
    finite = [v for v in values if _finite(v)]
    return float(reduce(finite)) if finite else float("nan")


def _weighted_dicts(parts: Sequence[dict[str, Any]], key: str, episodes: Sequence[float]) -> dict:
    collected: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for part, weight in zip(parts, episodes):
        for name, value in (part.get(key) or {}).items():
            collected[name].append((value, weight))
    return {
        name: _weighted([v for v, _ in pairs], [w for _, w in pairs])
        for name, pairs in collected.items()
    }


class DictMeans:
    """Per name, the mean of the finite numbers of dicts added one at a time: how perf
    times merge (a plain mean over parts), kept as sums and counts so that parts can be
    added as they come without keeping them."""

    def __init__(self) -> None:
        self._totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

    def add(self, values: dict[str, float] | None) -> None:
        """One part's numbers (non-finite ones left out, as every merge here does)."""
        for name, number in (values or {}).items():
            if _finite(number):
                total = self._totals[name]
                total[0] += number
                total[1] += 1

    def means(self) -> dict[str, float]:
        """The mean per name over the parts added so far that had it."""
        return {name: total / count for name, (total, count) in self._totals.items()}


def _mean_dicts(values: Sequence[dict[str, float]]) -> dict[str, float]:
    means = DictMeans()
    for value in values:
        means.add(value)
    return means.means()
