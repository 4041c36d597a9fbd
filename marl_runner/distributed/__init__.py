"""Runners on many processes and machines, on Ray: `EnvRunnerGroup`.

Ray is imported only when a group has remote runners, so a local-only group
(and everything else in marl_runner) works without it.
"""

from marl_runner.distributed.ray_session import connect_ray, ray_session
from marl_runner.distributed.runner_group import EnvRunnerGroup, EnvRunnerGroupError, RunnerFault

__all__ = ["EnvRunnerGroup", "EnvRunnerGroupError", "RunnerFault", "connect_ray", "ray_session"]
