"""Subprocess workers end with their parent: a `sample` killed while its workers still
build their sub-envs leaves no process behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from marl_runner.bench.envs.cheap_env import CheapEnv

REPO = Path(__file__).resolve().parent.parent


class SlowToBuild(CheapEnv):
    """A CheapEnv whose construction takes a minute (long past the test)."""

    def __init__(self, **kwargs) -> None:
        time.sleep(60)
        super().__init__(**kwargs)


PARENT = """
from marl_runner import EnvRunner
EnvRunner({
    "env": {"name": "tests.test_envs_worker_orphans:SlowToBuild", "api": "multi_agent"},
    "num_envs": 2, "vectorize": "subprocess", "num_workers": 2,
    "policies": {"p": {"model": {"type": "mlp", "hidden": [4]}}},
})
"""


@pytest.mark.slow  # waits for workers to start and end: test-all (make test stays under 3 minutes)
@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_workers_building_their_sub_envs_exit_when_the_parent_is_killed(kill: signal.Signals) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO)
    try:
        workers: list[psutil.Process] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = _workers(parent.pid)
            if len(workers) >= 2:
                break
            time.sleep(0.2)
        assert len(workers) >= 2, "the workers never started"
        time.sleep(0.5)  # inside SlowToBuild.__init__ by now
        parent.send_signal(kill)
        parent.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers left behind: {[p.pid for p in alive]}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _workers(parent_pid: int) -> list[psutil.Process]:
    """The env workers: the fork server's children (or, under spawn, the parent's own but
    multiprocessing's resource tracker)."""
    try:
        children = psutil.Process(parent_pid).children()
    except psutil.Error:
        return []
    workers = []
    for child in children:
        command = " ".join(_cmdline(child))
        if "forkserver" in command:
            workers += child.children()
        elif "resource_tracker" not in command:
            workers.append(child)
    return workers


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
