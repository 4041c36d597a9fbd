"""Envs: the MultiAgentEnv API, PettingZoo adapters, env registry and vector envs."""

from marl_runner.envs.base_env import BaseEnv
from marl_runner.envs.errors import EnvError, SubEnvGoneError
from marl_runner.envs.external_env import ExternalMultiAgentEnv
from marl_runner.envs.multi_agent_env import MultiAgentEnv
from marl_runner.envs.pettingzoo_wrappers import AECPettingZooEnv, ParallelPettingZooEnv
from marl_runner.envs.registry import make_env, register_env
from marl_runner.envs.subprocess_vector_env import SubprocessVectorEnv
from marl_runner.envs.sync_vector_env import SyncVectorEnv
from marl_runner.envs.vector_backends import VectorBuild, VectorKey, register_vector_backend
from marl_runner.envs.vector_factory import make_vector_env

__all__ = [
    "AECPettingZooEnv",
    "BaseEnv",
    "EnvError",
    "ExternalMultiAgentEnv",
    "MultiAgentEnv",
    "ParallelPettingZooEnv",
    "SubEnvGoneError",
    "SubprocessVectorEnv",
    "SyncVectorEnv",
    "VectorBuild",
    "VectorKey",
    "make_env",
    "make_vector_env",
    "register_env",
    "register_vector_backend",
]
