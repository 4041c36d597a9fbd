"""Policies: what maps a batch of per-agent inputs to actions."""

from marl_runner.policy.base import Policy
from marl_runner.policy.builder import build_policy
from marl_runner.policy.random_policy import RandomPolicy
from marl_runner.policy.torch_policy import TorchPolicy

__all__ = ["Policy", "RandomPolicy", "TorchPolicy", "build_policy"]
