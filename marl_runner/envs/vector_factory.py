"""`make_vector_env`: the vector env a runner config asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marl_runner.envs.base_env import BaseEnv
from marl_runner.envs.errors import EnvError
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.subprocess_vector_env import SubprocessVectorEnv
from marl_runner.envs.sync_vector_env import SyncVectorEnv

VECTORIZE_CHOICES = ("sync", "subprocess")


def make_vector_env(config: Any) -> BaseEnv:
    """Build the vector env described by a runner config.

    `config` is any object (or mapping) with `env` (name/config/api),
    `num_envs`, `seed`, `vectorize` (`sync` | `subprocess`) and
    `restart_failed_sub_environments`; `num_workers`, `async_poll` and
    `pin_workers` are read for `subprocess` when present.
    """
    factory = EnvFactory(_field(config, "env", None))
    num_envs = _field(config, "num_envs", 1)
    seed = _field(config, "seed", None)
    restart_failed = bool(_field(config, "restart_failed_sub_environments", False))
    vectorize = _field(config, "vectorize", "sync")
    if vectorize == "sync":
        return SyncVectorEnv(factory, num_envs, seed=seed, restart_failed=restart_failed)
    if vectorize == "subprocess":
        return SubprocessVectorEnv(
            factory,
            num_envs,
            seed=seed,
            restart_failed=restart_failed,
            num_workers=_field(config, "num_workers", None),
            async_poll=bool(_field(config, "async_poll", False)),
            pin_workers=bool(_field(config, "pin_workers", True)),
        )
    raise EnvError(f"vectorize {vectorize!r}: expected one of {list(VECTORIZE_CHOICES)}")


def _field(config: Any, key: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)
