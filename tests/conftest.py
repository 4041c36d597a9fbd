"""Shared fixtures: one local Ray for every Ray test of the session, which runs in the slow suite."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Worker processes (forkserver, Ray, the commands a test starts) import the test envs by
# name, e.g. `tests.envs:CrashingEnv`. pytest puts the checkout on this process's sys.path
# only; PYTHONPATH puts it on theirs.
REPO = str(Path(__file__).resolve().parent.parent)
_PATHS = os.environ.get("PYTHONPATH", "").split(os.pathsep)
if REPO not in _PATHS:
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO, *filter(None, _PATHS)])

# A process started in the background by a non-interactive shell inherits SIGINT ignored,
# and Python then installs no KeyboardInterrupt handler. The Ctrl-C tests need one, here and
# in the commands they start (a handled signal is reset to the default at exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _forkserver_with_the_runner_loaded() -> None:
    """Start this process's fork server with the runner (and so torch) imported.

    Many test envs live in test modules, which import the runner: a worker unpickling one
    would import torch itself, about 1.5 s per worker started. Forked from a server that
    has it, a worker starts in milliseconds. The product's own fork server preloads only
    `marl_runner.envs`, which keeps torch out of env workers (see marl_runner/__init__.py).
    """
    from marl_runner.envs.subprocess_pool import START_METHOD

    if START_METHOD == "forkserver":
        from multiprocessing import forkserver

        forkserver.set_forkserver_preload(["marl_runner.sampling.runner", "tests.envs"])
        forkserver.ensure_running()


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """A local Ray with 2 CPUs, started once; tests skip when Ray is not installed."""
    ray = pytest.importorskip(
        "ray", reason="Ray is not installed; the Ray tests need the extra: pip install 'marl-runner[ray]'"
    )
    from marl_runner.ray_support import quiet_token_auth_notice

    started = not ray.is_initialized()
    if started:
        quiet_token_auth_notice()  # as connect_ray does: auth stays on, its notice goes
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    if started:
        ray.shutdown()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a Ray cluster is slow: it runs in `make test-all`, not `make test`."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.slow)
