"""Builds a policy from its YAML entry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from connectors.imports import import_object
from marl_runner.policy.base import Policy
from marl_runner.policy.random_policy import RandomPolicy
from marl_runner.policy.torch_policy import TorchPolicy

__all__ = ["build_policy"]

_BUILTIN_CLASSES: dict[str, type[Policy]] = {
    "TorchPolicy": TorchPolicy,
    "RandomPolicy": RandomPolicy,
}


def _policy_class(policy_id: str, policy_class: Any) -> type[Policy]:
    if policy_class is None:
        return TorchPolicy
    if isinstance(policy_class, str):
        policy_class = _BUILTIN_CLASSES.get(policy_class) or import_object(policy_class)
    if not (isinstance(policy_class, type) and issubclass(policy_class, Policy)):
        raise ValueError(
            f"policy {policy_id!r}: policy_class {policy_class!r} is not a Policy subclass; "
            "expected 'TorchPolicy', 'RandomPolicy' or 'pkg.mod:Cls' naming a Policy subclass"
        )
    return policy_class


def build_policy(
    policy_id: str,
    spec: Mapping[str, Any] | None,
    observation_space: gym.Space,
    action_space: gym.Space,
    seed: int | None,
) -> Policy:
    """The policy described by ``spec``, a ``policies:`` entry of the config.

    Reads ``policy_class`` (default TorchPolicy), ``model`` and ``config``;
    other keys (connectors, spaces) belong to the runner. The class receives
    ``{**config, "model": model, "seed": seed}``; ``seed`` None keeps the
    entry's own seed, if any. Any ValueError from building it is re-raised
    with the policy id in front, so a bad entry is easy to find.
    """
    spec = spec or {}
    policy_cls = _policy_class(policy_id, spec.get("policy_class"))
    config = dict(spec.get("config") or {})
    if spec.get("model") is not None:
        config["model"] = spec["model"]
    if seed is not None:
        config["seed"] = seed
    try:
        return policy_cls(observation_space, action_space, config)
    except ValueError as err:
        raise ValueError(f"policy {policy_id!r}: {err}") from err
