"""Connecting this process to Ray without an address, for whoever needs Ray first.

The bottom floor of the package (it imports nothing of marl_runner), so that
both the Ray sub-env pool (`vectorize: ray`, in `marl_runner.envs`) and the
runner groups (`marl_runner.distributed`, which adds joining a cluster by
address, with its token rules) start or join Ray the same way. Ray is imported
only when called.

Since Ray 2.59 a local `ray.init()` turns token authentication on by default
and logs a notice saying so (and how to opt out) each time; that notice is
dropped here, and only it: authentication stays on, and Ray's warning that a
cluster runs WITHOUT authentication is kept.
"""

from __future__ import annotations

import logging

#: The logger and the opening words of the notice a local `ray.init()` prints each time
#: it turns token authentication on by default.
TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
ENABLED_NOTICE = "Token authentication is enabled for this Ray cluster"
#: `ray.init` options of every Ray this package starts or joins: no dashboard (a port and
#: a process nobody asked for), Ray's own log at warnings and above.
INIT_OPTIONS = {"include_dashboard": False, "logging_level": logging.WARNING}


class _DropEnabledNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(ENABLED_NOTICE)


def quiet_token_auth_notice() -> None:
    """Drop the notice a local `ray.init()` prints when it turns token authentication
    on by default (the notice only; see the module's docstring). Idempotent."""
    logger = logging.getLogger(TOKEN_SETUP_LOGGER)
    if not any(isinstance(existing, _DropEnabledNotice) for existing in logger.filters):
        logger.addFilter(_DropEnabledNotice())


def init_ray(num_cpus: int | None = None) -> bool:
    """Connect this process to Ray unless it is; True when this call connected it.

    Joins `RAY_ADDRESS`'s cluster or the one `ray start --head` runs on this
    machine, else starts a local Ray with `num_cpus` CPUs (None: all). An
    existing connection is reused and False returned, so the caller must not
    shut it down.
    """
    import ray

    if ray.is_initialized():
        return False
    quiet_token_auth_notice()
    try:
        ray.init(num_cpus=num_cpus, **INIT_OPTIONS)
    except ValueError:
        # An existing cluster was found: its resources are fixed, num_cpus must not be given.
        ray.init(**INIT_OPTIONS)
    return True
