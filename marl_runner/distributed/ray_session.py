"""Join a Ray cluster or start a local one, and end only what was started here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from marl_runner.distributed.ray_auth import (
    check_token,
    enable_token_mode,
    join_failure_hint,
    wants_token_mode,
)
from marl_runner.ray_support import INIT_OPTIONS, init_ray, quiet_token_auth_notice


def connect_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Make sure this process is connected to Ray; True when this call connected it.

    With `address` (e.g. "auto", "10.0.0.1:6379", "ray://head:10001") it
    joins that cluster, presenting a token when one is given
    (`RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`) or when the cluster is on this
    machine and `~/.ray/auth_token` exists (see `ray_auth`). A head that
    refuses the token (or its lack) is caught before joining, in
    milliseconds; that and any other failure to join raise ConnectionError
    saying what to check. Without `address` it joins the cluster that
    `ray start --head` runs on this machine (or `RAY_ADDRESS`), else starts a
    local Ray with `num_cpus` CPUs (default: all). An existing connection is
    reused and False returned, so the caller must not shut it down.
    """
    import ray

    if address is None:
        return init_ray(num_cpus)
    if ray.is_initialized():
        return False
    quiet_token_auth_notice()
    if wants_token_mode(address):
        enable_token_mode()
    check_token(address)
    try:
        ray.init(address=address, **INIT_OPTIONS)
    except ConnectionError as exc:
        raise ConnectionError(join_failure_hint(address)) from exc
    return True


@contextlib.contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[None]:
    """`connect_ray` for a block; on leaving, disconnects (ending a local Ray it started)
    only when it connected, so a cluster or session the caller owns is left running."""
    connected = connect_ray(address, num_cpus=num_cpus)
    try:
        yield
    finally:
        if connected:
            import ray

            ray.shutdown()
