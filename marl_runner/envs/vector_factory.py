"""`make_vector_env`: the vector env a runner config asks for, built by its backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import marl_runner.envs.vectorize  # noqa: F401  (registers the built-in backends)
from marl_runner.envs.base_env import BaseEnv
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.vector_backends import VectorBuild, vector_backend


def make_vector_env(config: Any) -> BaseEnv:
    """Build the vector env described by a runner config.

    `config` is any object (or mapping) with `env` (name/config/api),
    `num_envs`, `seed`, `vectorize` (a registered backend: `sync`,
    `subprocess`, `ray`, `external`, ...), `restart_failed_sub_environments`
    and `check_env_outputs`, plus the keys of its backend; a key it lacks
    takes the backend's default. An unknown `vectorize` is refused before
    any env is built.
    """
    backend = vector_backend(_field(config, "vectorize", "sync"))
    build = VectorBuild(
        factory=EnvFactory(_field(config, "env", None)),
        num_envs=_field(config, "num_envs", 1),
        seed=_field(config, "seed", None),
        restart_failed=bool(_field(config, "restart_failed_sub_environments", False)),
        check_env_outputs=bool(_field(config, "check_env_outputs", False)),
        options={key.name: _field(config, key.name, key.default) for key in backend.keys},
    )
    return backend.builder(build)


def _field(config: Any, key: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)
