"""`make_vector_env`: the vector env a runner config asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marl_runner.envs.base_env import BaseEnv
from marl_runner.envs.errors import EnvError
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.subprocess_vector_env import SubprocessVectorEnv
from marl_runner.envs.sync_vector_env import SyncVectorEnv
from marl_runner.envs.vectorize import VECTORIZE_MODES as VECTORIZE_CHOICES


def make_vector_env(config: Any) -> BaseEnv:
    """Build the vector env described by a runner config.

    `config` is any object (or mapping) with `env` (name/config/api),
    `num_envs`, `seed`, `vectorize` (`sync` | `subprocess` | `ray`) and
    `restart_failed_sub_environments`; `num_workers`, `async_poll` and
    `pin_workers` are read for `subprocess` when present.
    """
    factory = EnvFactory(_field(config, "env", None))
    num_envs = _field(config, "num_envs", 1)
    seed = _field(config, "seed", None)
    restart_failed = bool(_field(config, "restart_failed_sub_environments", False))
    vectorize = _field(config, "vectorize", "sync")
    check_env_outputs = bool(_field(config, "check_env_outputs", False))
    if vectorize == "sync":
        return SyncVectorEnv(
            factory,
            num_envs,
            seed=seed,
            restart_failed=restart_failed,
            check_env_outputs=check_env_outputs,
        )
    if vectorize == "subprocess":
        return SubprocessVectorEnv(
            factory,
            num_envs,
            seed=seed,
            restart_failed=restart_failed,
            num_workers=_field(config, "num_workers", None),
            async_poll=bool(_field(config, "async_poll", False)),
            pin_workers=bool(_field(config, "pin_workers", True)),
            check_env_outputs=check_env_outputs,
            step_timeout_s=_field(config, "sub_env_step_timeout_s", None),
        )
    if vectorize == "ray":
        try:  # lazily: Ray is an optional extra
            from marl_runner.envs.ray_vector_env import RayVectorEnv
        except ImportError as exc:
            raise EnvError(
                f"vectorize 'ray' needs Ray ({exc}); install it with: pip install 'marl-runner[ray]'"
            ) from exc
        return RayVectorEnv(
            factory,
            num_envs,
            seed=seed,
            restart_failed=restart_failed,
            num_cpus=_field(config, "remote_env_num_cpus", 0),
            batch_wait_ms=_field(config, "remote_env_batch_wait_ms", 0),
            step_timeout_s=_field(config, "sub_env_step_timeout_s", 60.0),
        )
    if vectorize == "external":
        from marl_runner.envs.external_vector_env import ExternalVectorEnv

        return ExternalVectorEnv(
            factory(),
            num_envs,
            episode_timeout_s=_field(config, "external_episode_timeout_s", 60.0),
            batch_wait_s=float(_field(config, "remote_env_batch_wait_ms", 0)) / 1000.0,
        )
    raise EnvError(f"vectorize {vectorize!r}: expected one of {list(VECTORIZE_CHOICES)}")


def _field(config: Any, key: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)
