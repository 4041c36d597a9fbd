"""Joining a Ray cluster that uses token authentication, as docs/SCALING.md says.

The slow test starts a real `ray start --head --block` with token authentication
on, in its own process group, temp dir, ports and HOME, joins it with
`marl-runner sample --runners 2 --address HOST:PORT` (and is refused, at once and
with one error line, with a wrong token or none), and ends only the processes it
started (never `ray stop`, which would end every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from marl_runner import check_batch_invariants, ray_support
from marl_runner.distributed import connect_ray, ray_auth
from marl_runner.io import read_batches

REPO = Path(__file__).resolve().parents[1]
KAZ = REPO / "examples" / "configs" / "kaz.yaml"
RAY = Path(sys.executable).parent / "ray"
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


@pytest.fixture
def clean_auth_env(monkeypatch, tmp_path) -> Path:
    """No Ray auth variables and an empty HOME (so no ~/.ray/auth_token); returns HOME."""
    for var in AUTH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _write_default_token(home: Path, token: str) -> None:
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(token)


# ----------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("127.0.0.1:6379", "127.0.0.1"),
        ("head.example:6379", "head.example"),
        ("ray://10.0.0.1:10001", "10.0.0.1"),
        ("[::1]:6379", "::1"),
    ],
)
def test_address_host(address, host) -> None:
    assert ray_auth.address_host(address) == host


def test_address_host_rejects_an_address_without_a_host() -> None:
    with pytest.raises(ValueError, match=r"':6379'.*HOST:PORT"):
        ray_auth.address_host(":6379")


def test_a_named_token_is_presented_to_any_address(clean_auth_env, monkeypatch) -> None:
    assert not ray_auth.wants_token_mode("10.9.8.7:6379")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    assert ray_auth.wants_token_mode("10.9.8.7:6379")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(clean_auth_env / "token"))
    assert ray_auth.wants_token_mode("10.9.8.7:6379")


def test_the_default_token_file_stays_on_this_machine(clean_auth_env) -> None:
    assert not ray_auth.wants_token_mode("127.0.0.1:6379")  # no token anywhere
    _write_default_token(clean_auth_env, "abc")
    assert ray_auth.wants_token_mode("127.0.0.1:6379")
    assert ray_auth.wants_token_mode("localhost:6379")
    assert not ray_auth.wants_token_mode("10.9.8.7:6379")  # another machine: not sent


def test_ray_auth_mode_and_auto_are_left_to_ray(clean_auth_env, monkeypatch) -> None:
    _write_default_token(clean_auth_env, "abc")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    assert not ray_auth.wants_token_mode("auto")  # Ray presents the local token itself
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert not ray_auth.wants_token_mode("127.0.0.1:6379")


def test_a_failed_join_says_what_to_check(clean_auth_env, monkeypatch) -> None:
    ray = pytest.importorskip("ray")

    def refuse(*args, **kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 10.9.8.7:6379")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ConnectionError) as caught:
        connect_ray("10.9.8.7:6379")
    message = str(caught.value)
    assert "'10.9.8.7:6379'" in message and "RAY_AUTH_TOKEN" in message
    assert "ray get-auth-token" in message and "docs/SCALING.md" in message
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert "unset it" in ray_auth.join_failure_hint("10.9.8.7:6379")


@contextlib.contextmanager
def fake_head(accepts: bool) -> Iterator[str]:
    """A gRPC server on a free port that answers a head's first question (the cluster
    ID) as a token-auth head does to a client with no token, or as an open head does."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("ray")
    from concurrent import futures

    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    class Head(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):
            if not accepts:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: missing")
            return gcs_service_pb2.GetClusterIdReply(cluster_id=b"\x01" * 28)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Head(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_a_head_that_refuses_is_found_before_joining(clean_auth_env, monkeypatch) -> None:
    """connect_ray asks the head first and never calls ray.init when it refuses."""
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init was called"))
    with fake_head(accepts=False) as address:
        started = time.monotonic()
        with pytest.raises(ConnectionError) as caught:
            connect_ray(address)
        assert time.monotonic() - started < 5.0  # Ray's own join retries for about 20 s
    assert str(caught.value).startswith(f"the Ray cluster at {address!r} refused this process")
    assert "none was sent: set RAY_AUTH_TOKEN" in str(caught.value)


def test_only_a_refusal_stops_the_join_early(clean_auth_env) -> None:
    """An open head, a port nobody listens on and addresses that are not a head's are
    left to ray.init, which waits for a head still starting and reports the rest."""
    with fake_head(accepts=True) as address:
        ray_auth.check_token(address)
    ray_auth.check_token(f"127.0.0.1:{_free_ports(1)[0]}")
    with fake_head(accepts=False) as address:
        ray_auth.check_token(f"ray://{address}")
        ray_auth.check_token("auto")


def test_a_refusal_says_which_token_went_and_what_to_set(clean_auth_env, monkeypatch) -> None:
    address = "10.9.8.7:6379"
    assert "none was sent: set RAY_AUTH_TOKEN" in ray_auth.token_refused_message(address)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/etc/ray_token")
    assert "token from RAY_AUTH_TOKEN_PATH (/etc/ray_token) is not the head's" in (
        ray_auth.token_refused_message(address)
    )
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")  # Ray's order: the variable first
    assert "token from RAY_AUTH_TOKEN is not" in ray_auth.token_refused_message(address)
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    assert f"token from {clean_auth_env}/.ray/auth_token is not" in (
        ray_auth.token_refused_message(address)
    )
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    message = ray_auth.token_refused_message(address)
    assert "RAY_AUTH_MODE=disabled is set, so none was sent: unset RAY_AUTH_MODE" in message
    assert message.startswith(f"the Ray cluster at {address!r}")
    assert message.endswith("(see docs/SCALING.md)")


def test_only_the_token_enabled_notice_is_quiet(caplog) -> None:
    ray_support.quiet_token_auth_notice()
    ray_support.quiet_token_auth_notice()  # idempotent: one filter
    logger = logging.getLogger(ray_support.TOKEN_SETUP_LOGGER)
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=ray_support.TOKEN_SETUP_LOGGER):
        logger.warning("%s. Set RAY_AUTH_MODE=disabled to opt out.", ray_support.ENABLED_NOTICE)
        logger.warning("Token authentication is disabled for this Ray cluster. Anyone ...")
    assert [record.getMessage()[:45] for record in caplog.records] == [
        "Token authentication is disabled for this Ray"
    ]


def test_without_an_address_ray_is_started_or_joined_once(monkeypatch) -> None:
    """`connect_ray()` and the Ray sub-env pool share `ray_support.init_ray`: quiet notice,
    no dashboard, and an existing cluster (fixed resources) joined without num_cpus."""
    ray = pytest.importorskip("ray")
    calls: list[dict] = []
    connected = [False]

    def init(**kwargs):
        calls.append(kwargs)
        if "num_cpus" in kwargs and kwargs["num_cpus"] is not None:
            raise ValueError(
                "When connecting to an existing cluster, num_cpus must not be provided"
            )
        connected[0] = True

    monkeypatch.setattr(ray, "is_initialized", lambda: connected[0])
    monkeypatch.setattr(ray, "init", init)
    assert connect_ray(num_cpus=2) is True
    options = {"include_dashboard": False, "logging_level": logging.WARNING}
    assert calls == [{"num_cpus": 2, **options}, options]
    assert ray_support.init_ray() is False  # connected already: reused, not owned
    assert connect_ray() is False
    assert len(calls) == 2
    assert len(logging.getLogger(ray_support.TOKEN_SETUP_LOGGER).filters) == 1


# ----------------------------------------------------------------------------- a real cluster


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)


@contextlib.contextmanager
def ray_head(env: dict[str, str], timeout_s: float = 180.0) -> Iterator[int]:
    """`ray start --head --block` on free ports with its own temp dir; yields its port.

    It runs in a new session, so ending its process group ends exactly the
    processes it started (GCS, raylet, workers), whoever else runs Ray here.
    """
    port, client_port, dashboard_port, agent_port = _free_ports(4)
    temp_dir = tempfile.mkdtemp(prefix="rtok")  # short: Ray's socket paths have a length limit
    command = [
        str(RAY), "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
        "--temp-dir", temp_dir, "--include-dashboard=false",
        "--ray-client-server-port", str(client_port), "--dashboard-port", str(dashboard_port),
        "--dashboard-agent-listen-port", str(agent_port),
    ]  # fmt: skip
    head = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    output: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(head.stdout, output), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not any("Ray runtime started" in line for line in seen):
            assert head.poll() is None, "ray start --head exited:\n" + "".join(seen)
            assert time.monotonic() < deadline, "ray start --head not up:\n" + "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(output.get(timeout=1.0))
        yield port
    finally:
        _end_process_group(head)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def _end_process_group(process: subprocess.Popen, grace_s: float = 60.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    # poll() reaps the leader: unreaped, it would keep the group "alive" for the whole grace.
    while time.monotonic() < deadline and (process.poll() is None or _group_alive(process.pid)):
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _sample(address: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "marl_runner.cli", "sample", str(KAZ), "--runners", "2",
        "--address", address, "--steps", "100", "--set", "num_envs=1",
        "--set", "rollout_fragment_length=50", "--out", str(out),
    ]  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.ray
def test_the_cli_joins_a_token_cluster_by_host_and_port(tmp_path) -> None:
    pytest.importorskip("ray", reason="needs the Ray extra: pip install 'marl-runner[ray]'")
    token = secrets.token_hex(32)
    head_home, other_home = tmp_path / "head_home", tmp_path / "other_home"
    head_home.mkdir()
    other_home.mkdir()
    _write_default_token(head_home, token)
    base = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    base.update(PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
    with ray_head({**base, "HOME": str(head_home), "RAY_AUTH_MODE": "token"}) as port:
        # On the head machine, as after `ray start --head` there: its ~/.ray/auth_token.
        here = _sample(f"127.0.0.1:{port}", tmp_path / "here", {**base, "HOME": str(head_home)})
        # From elsewhere (a HOME without the token file): the token handed over by variable.
        address = f"{_node_ip()}:{port}"
        joined = _sample(
            address, tmp_path / "other", {**base, "HOME": str(other_home), "RAY_AUTH_TOKEN": token}
        )
        # A wrong token, and none: refused at once, with our one error line and none of Ray's.
        refused = {}
        cases = (
            ("is not the head's", {"RAY_AUTH_TOKEN": secrets.token_hex(32)}),
            ("none was sent", {}),
        )
        for case, extra in cases:
            started = time.monotonic()
            result = _sample(
                address, tmp_path / "refused", {**base, "HOME": str(other_home), **extra}
            )
            refused[case] = (result, time.monotonic() - started)
    for case, (result, seconds) in refused.items():
        assert result.returncode != 0, result.stdout
        assert "InvalidAuthToken" not in result.stderr
        error = (
            f"marl-runner sample: error: ConnectionError: the Ray cluster at '{address}' refused"
        )
        assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
        assert result.stderr.startswith(error) and case in result.stderr, result.stderr
        assert "RAY_AUTH_TOKEN" in result.stderr
        # Ray's own join retries for about 20 s; the rest is the command's start-up.
        assert seconds < 15.0, f"refused after {seconds:.1f} s"
    for result, out in ((here, tmp_path / "here"), (joined, tmp_path / "other")):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "InvalidAuthToken" not in result.stderr
        assert "Token authentication is enabled" not in result.stderr
        batches = list(read_batches(out))
        assert sum(batch.env_steps() for batch in batches) >= 100
        for batch in batches:
            check_batch_invariants(batch)


def _node_ip() -> str:
    import ray.util

    return ray.util.get_node_ip_address()
