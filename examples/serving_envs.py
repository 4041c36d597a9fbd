"""External simulators for `marl-runner serve`, named by `env.name` in example configs.

A served env only declares the spaces: the HTTP clients play the episodes,
so `run()` keeps the default (return at once). Run `serve` from the
repository root so that `examples` is importable.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from marl_runner.envs import ExternalMultiAgentEnv


class DroneSwarm(ExternalMultiAgentEnv):
    """`num_drones` drones, each observing 8 floats (position, velocity, target) and
    choosing one of 5 moves (stay, north, east, south, west)."""

    def __init__(self, num_drones: int = 4) -> None:
        drones = [f"drone_{i}" for i in range(num_drones)]
        obs_space = gym.spaces.Box(-10.0, 10.0, (8,), np.float32)
        super().__init__(
            dict.fromkeys(drones, obs_space), dict.fromkeys(drones, gym.spaces.Discrete(5))
        )
