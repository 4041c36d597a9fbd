"""Naming the sub-env and agent whose obs an agent pipeline could not take.

Obs are checked against their spaces on every step only with
``check_env_outputs: true`` (it costs a ``contains`` per agent). Without it, an
obs of the wrong shape or type first shows as an agent connector failing on the
whole policy's rows; only then are the rows checked, to say which sub-env and
agent sent it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.data import AgentRows
from connectors.errors import ConnectorError
from marl_runner.envs.checks import describe_value
from marl_runner.envs.errors import EnvError


def run_agent_pipeline(
    pipeline: Callable[[AgentRows], AgentRows],
    rows: AgentRows,
    observation_space: Callable[[Any], gym.Space],
) -> AgentRows:
    """``pipeline(rows)``; a ConnectorError (or a connector's TypeError or ValueError, as
    numpy raises on an object array) where some row's raw obs does not fit its agent's
    ``observation_space`` (``_misfits``) is raised as an EnvError naming the first such row,
    and as itself where none does."""
    raw_obs = rows["obs"]
    try:
        return pipeline(rows)
    except (ConnectorError, TypeError, ValueError) as error:
        for env_id, agent_id, obs in zip(rows["env_ids"], rows["agent_ids"], raw_obs):
            space = observation_space(agent_id)
            if _misfits(obs, space):
                raise EnvError(
                    f"sub-env {int(env_id)}: an obs for agent {agent_id!r} does not fit its "
                    f"observation space {space}: got {describe_value(obs)} (the policy's "
                    f"agent connectors failed on it: {error}); with check_env_outputs: true "
                    "every obs is checked as it arrives, so such a sub-env fails alone (its "
                    "episode dropped, and restarted with restart_failed_sub_environments)"
                ) from error
        raise


def _misfits(obs: Any, space: gym.Space) -> bool:
    """Whether ``obs`` is what a connector cannot take: for a Box, not numbers of its shape
    (float64 values for a float32 Box, or values past its bounds, are taken as they are
    and so are not the cause); for other spaces, outside the space."""
    if isinstance(space, gym.spaces.Box):
        try:
            array = np.asarray(obs)
        except (TypeError, ValueError):  # a ragged sequence
            return True
        return array.shape != space.shape or array.dtype.kind not in "biuf"
    return not space.contains(obs)
