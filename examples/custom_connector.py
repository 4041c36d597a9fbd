"""A user agent connector, named by import path in a YAML config.

Shows: ``TimeFeature``, a small ``AgentConnector`` that appends the episode's
progress ``t / horizon`` to every observation (so a policy can tell how much
time is left before a time limit). It changes the observation, so it also
declares the new space in ``output_observation_space``: the policy is built
for ``Box(d + 1,)`` and a chain that cannot take it fails when it is built.
The config ``examples/configs/simple_spread_time_feature.yaml`` lists it as
``{name: examples.custom_connector:TimeFeature, horizon: 25}``.

Run from the repository root:

    python examples/custom_connector.py
    marl-runner sample examples/configs/simple_spread_time_feature.yaml --episodes 8

It prints the env's and the policy's observation spaces and a few sampled
rows' ``t`` next to the last observation column, then checks they agree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from connectors import AgentConnector, ConnectorContext, ConnectorError
from connectors.data import AgentRows

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "simple_spread_time_feature.yaml"


class TimeFeature(AgentConnector):
    """Appends ``min(t / horizon, 1)`` to each flat observation (``t``: the obs's index
    in the agent's episode). Put it after ``ObsPreprocessorConnector``, which makes
    observations flat float32 vectors."""

    def __init__(self, ctx: ConnectorContext, horizon: int = 25) -> None:
        super().__init__(ctx)
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ConnectorError(
                f"TimeFeature: horizon must be an int >= 1, got {horizon!r}", param="horizon"
            )
        self.horizon = horizon

    def params(self) -> dict[str, Any]:  # what to_state() saves and from_state() rebuilds
        return {"horizon": self.horizon}

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
            raise ConnectorError(
                f"TimeFeature takes a flat Box observation, got {space}; "
                "put ObsPreprocessorConnector before it"
            )
        low = np.append(space.low, 0.0).astype(np.float32)
        high = np.append(space.high, 1.0).astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)

    def __call__(self, rows: AgentRows) -> AgentRows:
        # Whole columns at once: obs is [n, d], t is [n] (one row per agent this round).
        progress = np.minimum(np.asarray(rows["t"], np.float32) / self.horizon, 1.0)
        rows["obs"] = np.concatenate([np.asarray(rows["obs"], np.float32), progress[:, None]], 1)
        return rows


def time_feature_horizon(agent_connectors: Any, config_path: Path) -> int:
    """The ``horizon`` of the ``TimeFeature`` in a policy's built agent connector chain.

    Looked up by class name: run as a script this module is ``__main__``, and the
    config's ``examples.custom_connector:TimeFeature`` is the same class imported again.
    """
    if "TimeFeature" not in agent_connectors:
        raise SystemExit(
            f"{config_path}: the first policy's agent connectors have no TimeFeature, got "
            f"{[type(connector).__name__ for connector in agent_connectors]}"
        )
    return agent_connectors["TimeFeature"].horizon


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Samples the config once; returns the spaces and the first policy batch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="runner config YAML")
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="at least this many env steps: the runner returns whole fragments "
        "(rollout_fragment_length steps of every sub-env), so often more",
    )
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:  # the config names "examples.custom_connector:TimeFeature"
        sys.path.insert(0, str(REPO))
    from marl_runner import EnvRunner, RunnerConfig, check_batch_invariants
    from marl_runner.checks import trajectory_rows

    config = RunnerConfig.from_yaml(args.config)
    with EnvRunner(config) as runner:
        env_space = runner.env.get_observation_space(runner.env.possible_agents[0])
        policy_id, (policy_space, _) = next(iter(runner.get_spaces().items()))
        horizon = time_feature_horizon(runner.policy_map[policy_id].agent_connectors, args.config)
        batch = runner.sample(num_env_steps=args.steps)
    check_batch_invariants(batch)
    rows = batch.policy_batches[policy_id]
    expected = np.minimum(rows["t"] / horizon, 1.0)
    print(f"env observation:    {env_space.shape} {env_space.dtype}")
    print(
        f"policy observation: {policy_space.shape} {policy_space.dtype}  (last column: t / {horizon})"
    )
    first_trajectory = next(iter(trajectory_rows(rows).values()))
    print(f"one agent's rows:\n{'t':>4}  last obs column")
    for row in first_trajectory[::4]:
        print(f"{rows['t'][row]:4d}  {rows['obs'][row, -1]:.3f}")
    applied = bool(np.allclose(rows["obs"][:, -1], expected))
    print(f"{len(rows)} rows; last column == min(t / {horizon}, 1) on every row: {applied}")
    if not applied:
        raise SystemExit("TimeFeature was not applied as expected")
    return {"env_space": env_space, "policy_space": policy_space, "batch": rows, "horizon": horizon}


if __name__ == "__main__":
    main()
