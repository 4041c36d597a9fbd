"""Builds each policy with its connector pipelines, spaces taken from the agents mapped to it.

The connector chains come first: the policy's observation space is the agent
chain's output, its action space what the action chain takes. Everything
that can go wrong here is a config problem, raised as ``ConfigError`` naming
the dotted key (``policies.p.agent_connectors[0].limt``), whether the runner
is about to sample or ``marl-runner validate`` only builds it.
"""

from __future__ import annotations

import zlib
from typing import Any

import gymnasium as gym

from connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorContext,
    ConnectorError,
    EnvStateAgentConnector,
    build_pipeline,
)
from marl_runner.config import ConfigError
from marl_runner.mapping import SpaceMismatchError
from marl_runner.policy import Policy, build_policy


class PolicyEntry:
    """A policy and its two connector pipelines."""

    __slots__ = (
        "policy_id",
        "policy",
        "agent_pipeline",
        "action_pipeline",
        "original_observation_space",
        "wants_postprocess",
    )

    def __init__(
        self,
        policy_id: str,
        policy: Policy,
        agent_pipeline: AgentConnectorPipeline,
        action_pipeline: ActionConnectorPipeline,
        original_observation_space: gym.Space,
    ) -> None:
        self.policy_id = policy_id
        self.policy = policy
        self.agent_pipeline = agent_pipeline
        self.action_pipeline = action_pipeline
        self.original_observation_space = original_observation_space
        # Splitting a batch into trajectories costs time; skip it when nobody looks.
        self.wants_postprocess = policy.wants_postprocessing()
        policy.agent_connectors = agent_pipeline
        policy.action_connectors = action_pipeline


def policy_seed(seed: int | None, policy_id: str) -> int | None:
    """A per-policy seed, stable across runs and independent of policy order."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + zlib.crc32(policy_id.encode())) % (2**31)


def build_entry(
    policy_id: str,
    spec: dict[str, Any] | Policy,
    observation_space: gym.Space | None,
    action_space: gym.Space | None,
    *,
    seed: int | None,
    runner_config: Any,
    agent: Any = None,
) -> PolicyEntry:
    """A policy and its pipelines; the spaces are those of the agents mapped to it.

    ``agent`` (one of those agents, when known) is named in errors.
    """
    if isinstance(spec, Policy):
        return _entry_for_ready_policy(
            policy_id, spec, observation_space, action_space, runner_config, agent
        )
    key = f"policies.{policy_id}"
    for space_key, env_space in (
        ("observation_space", observation_space),
        ("action_space", action_space),
    ):
        declared = spec.get(space_key)
        if declared is not None and env_space is not None and not spaces_fit(declared, env_space):
            raise SpaceMismatchError(
                f"{key}.{space_key}",
                f"policy {policy_id!r} is configured with {declared}, but {_agents(agent)} "
                f"mapped to it {'has' if agent is not None else 'have'} {env_space}",
            )
    policy_config = dict(spec.get("config") or {})
    policy_config.setdefault("device", runner_config.device)
    policy_config.setdefault("explore", runner_config.explore)
    ctx = ConnectorContext(
        observation_space=spec.get("observation_space") or observation_space,
        action_space=spec.get("action_space") or action_space,
        view_requirements=dict(policy_config.get("view_requirements") or {}),
        config={**policy_config, "normalize_actions": runner_config.normalize_actions},
    )
    agent_pipeline = _pipeline(spec.get("agent_connectors"), ctx, "agent", key)
    _add_env_state(agent_pipeline, runner_config)
    action_pipeline = _pipeline(spec.get("action_connectors"), ctx, "action", key)
    try:
        policy = build_policy(
            policy_id,
            {**spec, "config": policy_config},
            agent_pipeline.output_observation_space,
            action_pipeline.input_action_space,
            policy_seed(seed, policy_id),
        )
    except (ValueError, TypeError) as err:
        raise ConfigError(key, f"cannot build the policy: {err}") from err
    ctx.initial_states = policy.get_initial_state()
    return PolicyEntry(policy_id, policy, agent_pipeline, action_pipeline, ctx.observation_space)


def _entry_for_ready_policy(
    policy_id: str,
    policy: Policy,
    observation_space: gym.Space,
    action_space: gym.Space,
    runner_config: Any,
    agent: Any,
) -> PolicyEntry:
    key = f"policies.{policy_id}"
    ctx = ConnectorContext(
        observation_space=observation_space,
        action_space=action_space,
        initial_states=policy.get_initial_state(),
        view_requirements=dict(getattr(policy, "view_requirements", None) or {}),
        config={**(policy.config or {}), "normalize_actions": runner_config.normalize_actions},
    )
    agent_pipeline = policy.agent_connectors
    if agent_pipeline is None:
        agent_pipeline = _pipeline(None, ctx, "agent", key)
    _add_env_state(agent_pipeline, runner_config)
    action_pipeline = policy.action_connectors
    if action_pipeline is None:
        action_pipeline = _pipeline(None, ctx, "action", key)
    derived = agent_pipeline.output_observation_space
    if getattr(derived, "shape", None) != getattr(policy.observation_space, "shape", None):
        raise SpaceMismatchError(
            key,
            f"policy {policy_id!r} expects observations in {policy.observation_space}, but its "
            f"agent connectors turn the env's {observation_space} into {derived}",
        )
    wanted = action_pipeline.input_action_space
    if not spaces_fit(policy.action_space, wanted):
        through = "" if wanted == action_space else f" (its action connectors take {wanted})"
        raise SpaceMismatchError(
            key,
            f"policy {policy_id!r} acts in {policy.action_space}, but {_agents(agent)} mapped "
            f"to it {'has' if agent is not None else 'have'} action space {action_space}{through}",
        )
    return PolicyEntry(policy_id, policy, agent_pipeline, action_pipeline, observation_space)


def spaces_fit(space: gym.Space, other: gym.Space) -> bool:
    """Whether values of one space can stand for the other's: same kind and size.

    Bounds and dtypes may differ (a policy's Box(-1, 1) against the env's
    Box(0, 10) of the same shape is the action chain's business).
    """
    if type(space) is not type(other):
        return False
    if isinstance(space, gym.spaces.Discrete):
        return space.n == other.n and space.start == other.start
    if isinstance(space, gym.spaces.MultiDiscrete):
        return space.nvec.shape == other.nvec.shape and bool((space.nvec == other.nvec).all())
    if isinstance(space, gym.spaces.Dict):
        return space.spaces.keys() == other.spaces.keys() and all(
            spaces_fit(space[k], other[k]) for k in space.spaces
        )
    if isinstance(space, gym.spaces.Tuple):
        return len(space) == len(other) and all(map(spaces_fit, space, other))
    return space.shape == other.shape


def _agents(agent: Any) -> str:
    return "the agents" if agent is None else f"agent {agent!r}"


def _add_env_state(pipeline: AgentConnectorPipeline, runner_config: Any) -> None:
    """With ``env.capture_state``, the env's state leaves the infos first, as ``env_state``."""
    if runner_config.env.get("capture_state") and EnvStateAgentConnector not in pipeline:
        pipeline.prepend(EnvStateAgentConnector(pipeline.ctx))


def _pipeline(
    spec_list: list | None, ctx: ConnectorContext, kind: str, policy_key: str
) -> AgentConnectorPipeline | ActionConnectorPipeline:
    """The listed chain (``[]``: none at all), or the default one when none is listed."""
    key = f"{policy_key}.{kind}_connectors"
    try:
        return build_pipeline(spec_list, ctx, kind)  # type: ignore[arg-type]
    except ConnectorError as err:
        if err.index is not None:
            key += f"[{err.index}]"
            if err.param is not None:
                key += f".{err.param}"
        raise ConfigError(key, str(err)) from None
