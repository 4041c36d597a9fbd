"""``marl-runner validate``: build everything ``sample`` builds, without stepping, and show it.

Prints each possible agent's policy and spaces, notes policies no agent maps
to, and warns about image observations going into a model that flattens
them. Rejects exactly what ``sample`` rejects when it starts (same exit code
and message: both classify build errors with ``common.build_error``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

import gymnasium as gym
import numpy as np
from rich.console import Console

from marl_runner.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CheckedMapping,
    CommandError,
    agent_spaces,
    build_error,
    check_imports,
    check_memory,
    load_config,
)
from marl_runner.cli.display import spaces_table
from marl_runner.config import RunnerConfig
from marl_runner.config.memory import format_bytes
from marl_runner.envs.pettingzoo_wrappers import AECPettingZooEnv
from marl_runner.envs.vector_backends import vector_backend

__all__ = [
    "add_validate_parser",
    "group_rows",
    "image_model_warnings",
    "is_image_shaped",
    "run_validate",
]

#: Image channels, and the least height and width, of an observation that looks like a picture.
IMAGE_CHANNELS = (1, 3, 4)
MIN_IMAGE_SIDE = 32
#: With more agents than this, agents of one policy sharing their spaces are one table row.
GROUP_ABOVE = 20


def add_validate_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Registers ``validate`` (``common``: config, --set, --traceback)."""
    validate = commands.add_parser(
        "validate",
        parents=[common],
        help="check a config: build everything sample builds, without stepping, and show "
        "each agent's policy and spaces",
        description="Load the config, import what it names, and build the runner as sample "
        "does (one sub-env in this process): the env, every policy with its connector chains, "
        "the mapping of every possible agent (called as when sampling) and the checks that "
        "agents sharing a policy share spaces that fit it. Rejects exactly what sample rejects "
        "when it starts, with the same exit code (2) and message. Warns when image "
        "observations feed a model that flattens them (mlp, lstm).",
    )
    validate.add_argument(
        "--verbose",
        action="store_true",
        help=f"list every agent; by default, with more than {GROUP_ABOVE} agents, the agents "
        "of a policy that share their spaces are one row",
    )


def run_validate(args: argparse.Namespace) -> int:
    """Builds everything ``sample`` builds except stepping: a config it accepts builds there too."""
    config = load_config(args.config, args.overrides)
    check_imports(config)
    check_memory(config)  # before anything is built, as sample does
    try:
        from marl_runner.sampling.runner import EnvRunner  # imports torch
    except ImportError as exc:
        raise CommandError(f"the runner cannot be loaded: {exc}", EXIT_FAILURE) from exc
    mapping = _RecordingMapping(config)
    try:
        runner = EnvRunner(_validation_config(config), policy_mapping_fn=mapping)
    except Exception as exc:
        raise build_error(exc, config) from exc
    try:
        rows, unused_policies = _map_agents(runner, mapping.policy_of)
        warnings = image_model_warnings(runner)
        sub_envs = runner.env.get_sub_environments()
        memory, memory_limit = check_memory(
            config,
            agent_spaces(runner.env, lambda agent, _: mapping.policy_of[agent]),
            all_agents_act=not any(isinstance(env, AECPettingZooEnv) for env in sub_envs),
        )
    finally:
        runner.stop()

    console = Console()
    console.print(
        f"env {config.env['name']!r} (api: {config.env['api']}): "
        f"{_plural(len(rows), 'possible agent')}, {_plural(len(config.policies), 'policy', 'policies')}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(spaces_table(rows if args.verbose else group_rows(rows)))
    for policy_id in unused_policies:
        console.print(
            f"note: policy {policy_id!r} has no agent among the env's possible agents",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    for warning in warnings:
        console.print(f"warning: {warning}", highlight=False, soft_wrap=True, markup=False)
    console.print(
        f"memory: one batch takes about {format_bytes(memory.total_bytes)} per runner "
        f"({memory.describe()}); this process may use {format_bytes(memory_limit)}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    console.print(_columns_line(config), highlight=False, soft_wrap=True, markup=False)
    console.print(f"config OK: {args.config}", highlight=False, soft_wrap=True)
    return EXIT_OK


#: The columns every policy batch has unless ``exclude_columns`` leaves them out; a policy's
#: outputs and connector-added columns come beside them.
BATCH_COLUMNS = (
    "obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "infos", "eps_id",
    "env_id", "agent_index", "agent_id", "t", "env_t", "unroll_id", "continues",
    "policy_version",
)  # fmt: skip


def _columns_line(config: RunnerConfig) -> str:
    """The batch columns this run produces, so a user sees what `exclude_columns` changed."""
    left_out = list(config.exclude_columns)
    kept = [name for name in BATCH_COLUMNS if name not in left_out]
    line = (
        f"batch columns: {', '.join(kept)}, and each policy's outputs (e.g. action_logp, "
        "action_dist_inputs, vf_preds)"
    )
    return line + (f"; left out (exclude_columns): {', '.join(left_out)}" if left_out else "")


class _RecordingMapping(CheckedMapping):
    """The checked mapping that also notes each agent's policy, for the table."""

    def __init__(self, config: RunnerConfig) -> None:
        super().__init__(config)
        self.policy_of: dict[Any, str] = {}

    def __call__(self, agent_id: Any, episode: Any, **kwargs: Any) -> str:
        policy_id = super().__call__(agent_id, episode, **kwargs)
        self.policy_of[agent_id] = policy_id
        return policy_id


def _validation_config(config: RunnerConfig) -> RunnerConfig:
    """One sub-env, built by the backend's stand-in: what sampling builds, at the least cost."""
    stand_in = vector_backend(config.vectorize).validate_with
    return dataclasses.replace(config, num_envs=1, vectorize=stand_in)


def _map_agents(
    runner: Any, policy_of: dict[Any, str]
) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """Table rows (agent, policy, obs space, action space) and the policies no agent maps to.

    The runner mapped every possible agent while building its policies, and
    checked that agents sharing a policy share spaces that fit it.
    """
    env = runner.env
    rows = [
        (
            str(agent),
            policy_of[agent],
            str(env.get_observation_space(agent)),
            str(env.get_action_space(agent)),
        )
        for agent in env.possible_agents
    ]
    used = set(policy_of.values())
    return rows, [pid for pid in runner.config.policies if pid not in used]


def group_rows(rows: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """With more than ``GROUP_ABOVE`` agents, one row per (policy, obs space, action space):
    ``red_0 … red_80 (81 agents)``; the rows as they are otherwise."""
    if len(rows) <= GROUP_ABOVE:
        return rows
    groups: dict[tuple[str, str, str], list[str]] = {}
    for agent, *rest in rows:
        groups.setdefault(tuple(rest), []).append(agent)  # type: ignore[arg-type]
    return [
        (
            agents[0] if len(agents) == 1 else f"{agents[0]} … {agents[-1]} ({len(agents)} agents)",
            *key,
        )
        for key, agents in groups.items()
    ]


def is_image_shaped(space: gym.Space) -> bool:
    """A ``uint8`` Box ``(H, W, C)`` with C in 1/3/4 and H, W >= 32: a picture, not features."""
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8):
        return False
    if len(space.shape) != 3:
        return False
    height, width, channels = space.shape
    return channels in IMAGE_CHANNELS and min(height, width) >= MIN_IMAGE_SIDE


def image_model_warnings(runner: Any) -> list[str]:
    """One warning per built policy whose observations are images but whose model is
    a built-in that flattens them (``mlp``, ``lstm``): it trains, slowly and badly."""
    warnings = []
    for policy_id, spec in runner.config.policies.items():
        model_type = spec["model"].get("type")
        if model_type is None or model_type == "cnn" or policy_id not in runner.policy_map:
            continue  # a custom model class decides for itself
        space = runner.policy_map[policy_id].observation_space
        if is_image_shaped(space):
            warnings.append(
                f"policy {policy_id!r} gets image observations {space} but its model is "
                f"{model_type}, which flattens them into {math.prod(space.shape):,} inputs; "
                f"set policies.{policy_id}.model.type: cnn (see docs/CONFIG.md)"
            )
    return warnings


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"
