"""Generalised advantage estimation over one agent's trajectory.

Runs once per trajectory at post-processing time, never per step, so a
plain reverse loop is fast enough and avoids a scipy dependency.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["GAEConfig", "compute_gae", "discounted_cumsum", "parse_gae_config"]


class GAEConfig:
    """Discount ``gamma`` and GAE ``lambda_`` for one policy."""

    def __init__(self, gamma: float = 0.99, lambda_: float = 0.95) -> None:
        self.gamma = float(gamma)
        self.lambda_ = float(lambda_)


def parse_gae_config(config: Mapping[str, Any] | bool | None) -> GAEConfig | None:
    """``{gamma, lambda}`` (or ``True`` for the defaults) -> GAEConfig; None/False -> no GAE."""
    if config is None or config is False:
        return None
    if config is True:
        return GAEConfig()
    if not isinstance(config, Mapping):
        raise ValueError(f"policy config 'gae' must be a mapping {{gamma, lambda}}, got {config!r}")
    unknown = sorted(set(config) - {"gamma", "lambda"})
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in policy config 'gae'; expected 'gamma', 'lambda'"
        )
    return GAEConfig(config.get("gamma", 0.99), config.get("lambda", 0.95))


def discounted_cumsum(values: np.ndarray, discount: float) -> np.ndarray:
    """``out[t] = sum_k discount**k * values[t + k]`` (float64)."""
    # Python floats: a loop over a list is several times faster than over numpy scalars.
    sums_backwards = []
    running = 0.0
    for value in reversed(np.asarray(values, dtype=np.float64).tolist()):
        running = value + discount * running
        sums_backwards.append(running)
    return np.array(sums_backwards[::-1], dtype=np.float64)


def compute_gae(
    rewards: np.ndarray,
    vf_preds: np.ndarray,
    last_value: float,
    gamma: float,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(advantages, value_targets)`` as float32 arrays.

    ``last_value`` is the value of the observation after the last row: 0 when
    the trajectory ends in termination, else the bootstrap value. Value
    targets are ``advantages + vf_preds`` (the lambda-return).
    """
    vf_preds = np.asarray(vf_preds, dtype=np.float64)
    next_values = np.append(vf_preds[1:], last_value)
    deltas = np.asarray(rewards, dtype=np.float64) + gamma * next_values - vf_preds
    advantages = discounted_cumsum(deltas, gamma * lambda_)
    return advantages.astype(np.float32), (advantages + vf_preds).astype(np.float32)
