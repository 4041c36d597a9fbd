"""Builds each policy with its connector pipelines, spaces taken from the env's agents."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym

from connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorContext,
    build_pipeline,
    default_action_connectors,
    default_agent_connectors,
)
from marl_runner.policy import Policy, build_policy


class SpaceMismatchError(ValueError):
    """Agents mapped to one policy disagree on their spaces, or a policy does not fit them."""


class PolicyEntry:
    """A policy and its two connector pipelines."""

    __slots__ = (
        "policy_id", "policy", "agent_pipeline", "action_pipeline",
        "original_observation_space", "wants_postprocess",
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


def infer_policy_spaces(
    agents: Iterable[Any],
    policy_for: Callable[[Any], str],
    observation_space: Callable[[Any], gym.Space],
    action_space: Callable[[Any], gym.Space],
) -> dict[str, tuple[gym.Space, gym.Space, Any]]:
    """``policy_id -> (obs_space, action_space, first agent)`` from the agents mapped to it."""
    spaces: dict[str, tuple[gym.Space, gym.Space, Any]] = {}
    for agent in agents:
        policy_id = policy_for(agent)
        obs_space, act_space = observation_space(agent), action_space(agent)
        if policy_id not in spaces:
            spaces[policy_id] = (obs_space, act_space, agent)
            continue
        known_obs, known_act, first_agent = spaces[policy_id]
        for kind, known, space in (("observation", known_obs, obs_space), ("action", known_act, act_space)):
            if known != space:
                raise SpaceMismatchError(
                    f"agents {first_agent!r} and {agent!r} both map to policy {policy_id!r} "
                    f"but have different {kind} spaces: {known} vs {space}; agents sharing "
                    f"a policy must share spaces (map them to different policies)"
                )
    return spaces


def policy_seed(seed: int | None, policy_id: str) -> int | None:
    """A per-policy seed, stable across runs and independent of policy order."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + zlib.crc32(policy_id.encode())) % (2**31)


def build_entry(
    policy_id: str,
    spec: dict[str, Any] | Policy,
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    seed: int | None,
    runner_config: Any,
) -> PolicyEntry:
    """Connector pipelines first, so the policy's input space is derived from them."""
    if isinstance(spec, Policy):
        return _entry_for_ready_policy(policy_id, spec, observation_space, action_space, runner_config)
    policy_config = dict(spec.get("config") or {})
    policy_config.setdefault("device", runner_config.device)
    policy_config.setdefault("explore", runner_config.explore)
    ctx = ConnectorContext(
        observation_space=spec.get("observation_space") or observation_space,
        action_space=spec.get("action_space") or action_space,
        view_requirements=dict(policy_config.get("view_requirements") or {}),
        config={**policy_config, "normalize_actions": runner_config.normalize_actions},
    )
    agent_pipeline = _agent_pipeline(spec.get("agent_connectors"), ctx)
    policy = build_policy(
        policy_id,
        {**spec, "config": policy_config},
        agent_pipeline.output_observation_space,
        ctx.action_space,
        policy_seed(seed, policy_id),
    )
    ctx.initial_states = policy.get_initial_state()
    action_pipeline = _action_pipeline(spec.get("action_connectors"), ctx)
    return PolicyEntry(policy_id, policy, agent_pipeline, action_pipeline, ctx.observation_space)


def _entry_for_ready_policy(
    policy_id: str, policy: Policy, observation_space: gym.Space, action_space: gym.Space,
    runner_config: Any,
) -> PolicyEntry:
    ctx = ConnectorContext(
        observation_space=observation_space,
        action_space=action_space,
        initial_states=policy.get_initial_state(),
        view_requirements=dict(getattr(policy, "view_requirements", None) or {}),
        config={**(policy.config or {}), "normalize_actions": runner_config.normalize_actions},
    )
    agent_pipeline = policy.agent_connectors
    if agent_pipeline is None:
        agent_pipeline = _agent_pipeline(None, ctx)
    action_pipeline = policy.action_connectors
    if action_pipeline is None:
        action_pipeline = _action_pipeline(None, ctx)
    derived = agent_pipeline.output_observation_space
    if getattr(derived, "shape", None) != getattr(policy.observation_space, "shape", None):
        raise SpaceMismatchError(
            f"policy {policy_id!r} expects observations in {policy.observation_space}, but its "
            f"agent connectors turn the env's {observation_space} into {derived}"
        )
    return PolicyEntry(policy_id, policy, agent_pipeline, action_pipeline, observation_space)


def _agent_pipeline(spec_list: list | None, ctx: ConnectorContext) -> AgentConnectorPipeline:
    """The listed chain (``[]``: none at all), or the default one when none is listed."""
    if spec_list is not None:
        return build_pipeline(spec_list, ctx, kind="agent")
    return AgentConnectorPipeline(ctx, default_agent_connectors(ctx))


def _action_pipeline(spec_list: list | None, ctx: ConnectorContext) -> ActionConnectorPipeline:
    if spec_list is not None:
        return build_pipeline(spec_list, ctx, kind="action")
    return ActionConnectorPipeline(ctx, default_action_connectors(ctx))
