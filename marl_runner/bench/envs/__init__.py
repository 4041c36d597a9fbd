"""The envs the bench commands run, shipped for them: CheapEnv (the throughput
workloads and process pools), RandomFaultEnv (the soak) and ThreadedExternalEnv (the
serving memory bench). The tests build on them too; their other envs live in tests/envs.
"""

from marl_runner.bench.envs.cheap_env import CheapEnv
from marl_runner.bench.envs.external_envs import ThreadedExternalEnv
from marl_runner.bench.envs.random_fault_env import CrashingEnvError, RandomFaultEnv
from marl_runner.bench.envs.scripted_env import Round, ScriptedEnv

__all__ = [
    "CheapEnv",
    "CrashingEnvError",
    "RandomFaultEnv",
    "Round",
    "ScriptedEnv",
    "ThreadedExternalEnv",
]
