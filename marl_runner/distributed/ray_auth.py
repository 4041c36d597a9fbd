"""Ray token authentication when joining a cluster by address: which token to present.

Ray has token authentication since 2.52, on by default for local clusters
since 2.59: `ray start --head` turns it on when a token exists
(`~/.ray/auth_token`, `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`), and a local
`ray.init()` creates one. A client joining with `address="auto"` presents
this machine's token by itself, but one joining an explicit `HOST:PORT` does
so only with `RAY_AUTH_MODE=token`, and otherwise retries for about 20 s and
fails with `InvalidAuthToken` in its log. Ray holds back on purpose: a token
must not be sent to a host nobody named it for. So marl-runner turns token mode on for an explicit address only when that is what
the user asked for or when the token cannot leave this machine:

- `RAY_AUTH_MODE` set: Ray's own choice, left alone (`disabled` included);
- `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH` set: the user named a token for
  this command, so it is presented;
- the address is this machine and `~/.ray/auth_token` exists: the cluster and
  the token file are on this machine, as with `address="auto"`.

A client in token mode still joins a cluster without authentication. Before
joining, `check_token` asks the head once whether it takes the token presented
(or none), so a wrong or missing token fails at once with an error that says
what to set, instead of Ray's 20 s of retries and raw log lines. The notice a
local `ray.init()` prints is quieted by `marl_runner.ray_support`, re-exported
here for code that imports it from this module.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from marl_runner.ray_support import ENABLED_NOTICE, TOKEN_SETUP_LOGGER, quiet_token_auth_notice

__all__ = [
    "ENABLED_NOTICE",
    "TOKEN_SETUP_LOGGER",
    "address_host",
    "check_token",
    "default_token_path",
    "enable_token_mode",
    "is_this_machine",
    "join_failure_hint",
    "presented_token_source",
    "quiet_token_auth_notice",
    "token_refused_message",
    "wants_token_mode",
]

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
_SET_TOKEN = (
    "set RAY_AUTH_TOKEN to the head's token (`ray get-auth-token` on the head prints it) "
    "or RAY_AUTH_TOKEN_PATH to a file holding it"
)


def default_token_path() -> Path:
    """Where `ray start` / `ray get-auth-token --generate` keep this user's token."""
    return Path.home() / ".ray" / "auth_token"


def address_host(address: str) -> str:
    """The host of a Ray address: `"10.0.0.1:6379"`, `"ray://head:10001"`, `"[::1]:6379"`."""
    host = urlsplit(address if "://" in address else f"//{address}").hostname
    if not host:
        raise ValueError(f"Ray address {address!r}: expected HOST:PORT, 'auto' or ray://HOST:PORT")
    return host


def is_this_machine(host: str) -> bool:
    """Whether `host` names this machine: loopback, its hostname or its node IP."""
    if host in _LOOPBACK or host.startswith("127."):
        return True
    import ray.util

    return host in {socket.gethostname(), socket.getfqdn(), ray.util.get_node_ip_address()}


def wants_token_mode(address: str) -> bool:
    """Whether joining the explicit `address` should present a token (rules above)."""
    if address == "auto" or os.environ.get(AUTH_MODE_VAR) is not None:
        return False
    if any(os.environ.get(var) for var in TOKEN_VARS):
        return True
    return default_token_path().is_file() and is_this_machine(address_host(address))


def enable_token_mode() -> None:
    """Set `RAY_AUTH_MODE=token` for this process and the ones it starts.

    Ray reads the variable into its cached config when it is imported, so the
    config is re-read too, as Ray itself does when it turns token mode on.
    """
    from ray._raylet import Config

    os.environ[AUTH_MODE_VAR] = "token"
    Config.initialize("")


def join_failure_hint(address: str) -> str:
    """What to check when joining `address` failed; with token authentication on, Ray
    reports a missing or wrong token only in its log, as a failure to connect."""
    mode = os.environ.get(AUTH_MODE_VAR)
    if mode == "disabled":
        token = "RAY_AUTH_MODE=disabled is set, so no token is presented: unset it"
    elif mode == "token" or any(os.environ.get(var) for var in TOKEN_VARS):
        token = (
            "check that the token presented (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
            "~/.ray/auth_token) is the head's: `ray get-auth-token` on the head prints it"
        )
    else:
        token = f"if the cluster uses token authentication, {_SET_TOKEN}"
    return (
        f"could not join the Ray cluster at {address!r}: check that `ray start --head` runs "
        f"there and its port is reachable from here; {token} (see docs/SCALING.md)"
    )


def presented_token_source() -> str | None:
    """Where the token this process presents comes from, in Ray's order; None when it
    presents none (token mode off)."""
    if os.environ.get(AUTH_MODE_VAR) != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if path := os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH ({path})"
    return str(default_token_path())


def token_refused_message(address: str) -> str:
    """The error for a head at `address` that refused this process's token, or its lack."""
    source = presented_token_source()
    if os.environ.get(AUTH_MODE_VAR) == "disabled":
        fix = (
            "it needs a token and RAY_AUTH_MODE=disabled is set, so none was sent: unset "
            f"RAY_AUTH_MODE (and, off the head machine, {_SET_TOKEN})"
        )
    elif source is None:
        fix = f"it needs a token and none was sent: {_SET_TOKEN}"
    else:
        fix = f"the token from {source} is not the head's: {_SET_TOKEN}"
    return f"the Ray cluster at {address!r} refused this process: {fix} (see docs/SCALING.md)"


def check_token(address: str, timeout_s: float = 5.0) -> None:
    """Raise ConnectionError (`token_refused_message`) when the head at `address` refuses
    the token this process presents, or its lack.

    `ray.init` retries a refused token for about 20 s and logs each try as a raw
    `InvalidAuthToken` line; one gRPC call for the cluster ID, the first thing a
    joining client asks the head, gets the same answer in milliseconds. Every
    other outcome (no answer yet, a `ray://` or `auto` address, a Ray without
    token authentication or without grpcio) is left to `ray.init` to handle.
    """
    if address == "auto" or "://" in address:
        return
    try:
        import grpc
        from ray._private.grpc_utils import init_grpc_channel
        from ray._raylet import AuthenticationTokenLoader  # noqa: F401 (Ray with token auth)
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return
    channel = init_grpc_channel(address)  # with Ray's token interceptor when in token mode
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise ConnectionError(token_refused_message(address)) from None
    finally:
        channel.close()
