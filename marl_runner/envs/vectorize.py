"""The built-in ``vectorize`` backends: sync, subprocess, ray and external.

Each is a builder plus one ``register_vector_backend`` line naming the
config keys it reads; a new backend may share these keys (register the same
``VectorKey``). ``VECTORIZE_MODES`` is the registered names, as they are now. A builder imports its vector env when it runs, so
importing this module (as ``marl_runner.config`` does) never imports Ray.
"""

from __future__ import annotations

from typing import Any

from marl_runner.envs.base_env import BaseEnv
from marl_runner.envs.errors import EnvError
from marl_runner.envs.vector_backends import (
    BackendConfigError,
    VectorBuild,
    VectorKey,
    bool_check,
    int_check,
    number_check,
    register_vector_backend,
    vector_backend_names,
)

__all__ = [
    "ASYNC_POLL",
    "BATCH_WAIT",
    "EPISODE_TIMEOUT",
    "NUM_CPUS",
    "NUM_ENVS_PER_POLL",
    "NUM_WORKERS",
    "PIN_WORKERS",
    "STEP_TIMEOUT",
    "build_external",
    "build_ray",
    "build_subprocess",
    "build_sync",
    "check_envs_per_poll",
    "check_subprocess",
]

NUM_WORKERS = VectorKey(
    "num_workers",
    None,
    "subprocess: worker processes; null means min(num_envs, CPU cores).",
    int_check(1, optional=True),
)
NUM_ENVS_PER_POLL = VectorKey(
    "num_envs_per_poll",
    None,
    "subprocess/ray: the fewest sub-envs a poll waits for (async pools, like EnvPool's "
    "batch_size): a poll returns once that many are ready, so a slow sub-env never stalls "
    "the others; batches then depend on timing. null: subprocess waits for all (batches "
    "equal sync's), ray returns whoever is ready (1).",
    int_check(1, optional=True),
)
ASYNC_POLL = VectorKey(
    "async_poll",
    False,
    "subprocess/ray: short for num_envs_per_poll: 1 (a poll returns the sub-envs that are "
    "ready, so workers step while inference runs); setting both is an error.",
    bool_check,
)
PIN_WORKERS = VectorKey(
    "pin_workers",
    True,
    "subprocess: pin each worker to its own core when workers plus this process fill "
    "the machine (Linux); keeps the scheduler from stacking woken workers on one core.",
    bool_check,
)
STEP_TIMEOUT = VectorKey(
    "sub_env_step_timeout_s",
    60.0,
    "subprocess/ray: a step or reset slower than this is a fault; null waits forever.",
    number_check("a number of seconds > 0, or null", lambda v: v > 0, optional=True),
)
BATCH_WAIT = VectorKey(
    "remote_env_batch_wait_ms",
    0,
    "ray/external: how long poll waits for more sub-envs after the first answered, so one "
    "forward pass batches more of them.",
    number_check("a number >= 0", lambda v: v >= 0),
)
NUM_CPUS = VectorKey(
    "remote_env_num_cpus",
    0,
    "ray: CPUs reserved for each sub-env actor.",
    number_check("a number >= 0", lambda v: v >= 0),
)
EPISODE_TIMEOUT = VectorKey(
    "external_episode_timeout_s",
    60.0,
    "external: an episode quiet this long ends as faulty; null: never.",
    number_check("a number of seconds > 0, or null", lambda v: v > 0, optional=True),
)


def build_sync(build: VectorBuild) -> BaseEnv:
    """Every sub-env stepped in this process."""
    from marl_runner.envs.sync_vector_env import SyncVectorEnv

    return SyncVectorEnv(
        build.factory,
        build.num_envs,
        seed=build.seed,
        restart_failed=build.restart_failed,
        check_env_outputs=build.check_env_outputs,
    )


def build_subprocess(build: VectorBuild) -> BaseEnv:
    """Sub-envs in worker processes on this machine."""
    from marl_runner.envs.subprocess_vector_env import SubprocessVectorEnv

    options = build.options
    return SubprocessVectorEnv(
        build.factory,
        build.num_envs,
        seed=build.seed,
        restart_failed=build.restart_failed,
        num_workers=options["num_workers"],
        async_poll=bool(options["async_poll"]),
        num_envs_per_poll=options["num_envs_per_poll"],
        pin_workers=bool(options["pin_workers"]),
        check_env_outputs=build.check_env_outputs,
        step_timeout_s=options["sub_env_step_timeout_s"],
    )


def build_ray(build: VectorBuild) -> BaseEnv:
    """Each sub-env a Ray actor; Ray is an optional extra, imported only here."""
    try:
        from marl_runner.envs.ray_vector_env import RayVectorEnv
    except ImportError as exc:
        raise EnvError(
            f"vectorize 'ray' needs Ray ({exc}); install it with: pip install 'marl-runner[ray]'"
        ) from exc
    options = build.options
    per_poll = options["num_envs_per_poll"]
    if options["async_poll"]:
        if per_poll is not None:
            raise EnvError(
                f"async_poll and num_envs_per_poll={per_poll!r} both given: async_poll is "
                "short for num_envs_per_poll=1; give one of them"
            )
        per_poll = 1
    return RayVectorEnv(
        build.factory,
        build.num_envs,
        seed=build.seed,
        restart_failed=build.restart_failed,
        num_cpus=options["remote_env_num_cpus"],
        batch_wait_ms=options["remote_env_batch_wait_ms"],
        step_timeout_s=options["sub_env_step_timeout_s"],
        num_envs_per_poll=per_poll,
    )


def build_external(build: VectorBuild) -> BaseEnv:
    """Episodes driven from outside (an ExternalMultiAgentEnv, policy clients)."""
    from marl_runner.envs.external_vector_env import ExternalVectorEnv

    return ExternalVectorEnv(
        build.factory(),
        build.num_envs,
        episode_timeout_s=build.options["external_episode_timeout_s"],
        batch_wait_s=float(build.options["remote_env_batch_wait_ms"]) / 1000.0,
    )


def check_envs_per_poll(config: Any) -> None:
    """``num_envs_per_poll`` within ``num_envs``, and not given together with ``async_poll``."""
    per_poll = config.num_envs_per_poll
    if per_poll is None:
        return
    if config.async_poll:
        raise BackendConfigError(
            "num_envs_per_poll",
            f"got {per_poll!r} with async_poll: true, which is short for num_envs_per_poll: 1; "
            "set one of them",
        )
    if per_poll > config.num_envs:
        raise BackendConfigError(
            "num_envs_per_poll",
            f"got {per_poll!r}, expected an integer in [1, num_envs={config.num_envs}], or null",
        )


def check_subprocess(config: Any) -> None:
    """At most one worker per sub-env, and ``check_envs_per_poll``."""
    if config.num_workers is not None and config.num_workers > config.num_envs:
        raise BackendConfigError(
            "num_workers",
            f"got {config.num_workers}, expected at most num_envs ({config.num_envs}): "
            "each worker process steps at least one sub-env",
        )
    check_envs_per_poll(config)


register_vector_backend("sync", build_sync, doc="Every sub-env stepped in this process.")
register_vector_backend(
    "subprocess",
    build_subprocess,
    doc="Sub-envs in worker processes on this machine.",
    keys=(NUM_WORKERS, NUM_ENVS_PER_POLL, ASYNC_POLL, PIN_WORKERS, STEP_TIMEOUT),
    check=check_subprocess,
)
register_vector_backend(
    "ray",
    build_ray,
    doc="Each sub-env a Ray actor (needs the ray extra).",
    keys=(NUM_ENVS_PER_POLL, ASYNC_POLL, STEP_TIMEOUT, BATCH_WAIT, NUM_CPUS),
    check=check_envs_per_poll,
)
register_vector_backend(
    "external",
    build_external,
    doc="Episodes driven from outside: an ExternalMultiAgentEnv or policy clients "
    "(marl-runner serve).",
    keys=(EPISODE_TIMEOUT, BATCH_WAIT),
    validate_with="external",
)


def __getattr__(name: str) -> Any:
    """``VECTORIZE_MODES``: the registered backends' names, as they are now."""
    if name == "VECTORIZE_MODES":
        return vector_backend_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
