"""``bench --memory`` on every backend: the main process and each env worker or actor process.

Smoke-sized (a few thousand agent steps); growth figures mean nothing here, only
which processes are watched and how a verdict is reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = str(Path(__file__).resolve().parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from marl_runner import EnvRunner  # noqa: E402
from marl_runner.bench.cli import main  # noqa: E402
from marl_runner.bench.measure import Settings  # noqa: E402
from marl_runner.bench.memory_backends import (  # noqa: E402
    RAY_MISSING,
    Watched,
    parse_backends,
    sample_and_watch,
    watched_processes,
)
from marl_runner.bench.workloads import get_workload  # noqa: E402


def _memory(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, str]:
    assert main(["--smoke", "--json", "--memory", *args]) == 0
    out = capsys.readouterr()
    return json.loads(out.out)["memory"], out.err


def test_subprocess_reports_the_main_process_and_each_env_worker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    memory, table = _memory(capsys, "--memory-backends", "subprocess", "--num-workers", "2")

    (result,) = memory["backends"]
    assert result["backend"] == "subprocess" and result["num_workers"] == 2
    roles = [p["role"] for p in result["processes"]]
    assert roles == ["main", "env worker 0", "env worker 1"]
    pids = [p["pid"] for p in result["processes"]]
    assert pids[0] == os.getpid() and len(set(pids)) == 3
    for process in result["processes"]:
        assert process["start_rss_mb"] > 0 and isinstance(process["ok"], bool)
    assert result["start_rss_mb"] == pytest.approx(sum(p["start_rss_mb"] for p in result["processes"]))
    assert result["end_agent_steps"] > result["start_agent_steps"] > 0
    assert "env worker 1" in table and "all (sum)" in table


def test_ray_reports_each_sub_env_actor_process(
    capsys: pytest.CaptureFixture[str], ray_local
) -> None:
    memory, table = _memory(capsys, "--memory-backends", "ray")

    (result,) = memory["backends"]
    assert result["backend"] == "ray" and result["num_envs"] == 2  # smoke: 2 actors
    roles = [p["role"] for p in result["processes"]]
    assert roles == ["main", "sub-env actor 0", "sub-env actor 1"]
    pids = [p["pid"] for p in result["processes"]]
    assert pids[0] == os.getpid() and len(set(pids)) == 3
    assert all(p["start_rss_mb"] > 0 for p in result["processes"])
    assert "sub-env actor 1" in table
    assert ray_local.is_initialized()  # a Ray the bench did not start is left running


@pytest.mark.slow
def test_ray_the_bench_starts_is_shut_down_afterwards() -> None:
    """In a fresh process, so no Ray of this test session is running."""
    script = (
        "import ray\n"
        "from marl_runner.bench.measure import Settings\n"
        "from marl_runner.bench.memory_backends import measure_backend\n"
        "r = measure_backend('ray', Settings.for_smoke(), start_steps=500, end_steps=1000,\n"
        "                    every_steps=500, ray_num_envs=1)\n"
        "print(len(r['processes']), ray.is_initialized())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["2", "False"]


def test_ray_is_skipped_with_the_reason_when_not_installed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError

    memory, table = _memory(capsys, "--memory-backends", "sync,ray")

    sync, ray = memory["backends"]
    assert sync["backend"] == "sync" and sync["processes"][0]["role"] == "main"
    assert ray == {"backend": "ray", "skipped": RAY_MISSING}
    assert "ray skipped: Ray is not installed" in " ".join(table.split())  # however it wraps


def test_memory_backends_are_parsed_in_measuring_order() -> None:
    assert parse_backends("ray, sync") == ("sync", "ray")
    for bad in ("sync,gpu", "", ","):
        with pytest.raises(ValueError, match="expected a comma-separated list of sync, subprocess"):
            parse_backends(bad)


def test_unknown_memory_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--smoke", "--memory", "--memory-backends", "sync,gpu"])
    assert exited.value.code == 2
    assert "memory backends 'sync,gpu': expected a comma-separated list" in capsys.readouterr().err


class _GrowingProcess:
    """Stands in for a psutil.Process whose RSS grows by ``step_mb`` per reading."""

    def __init__(self, pid: int, rss_mb: float, step_mb: float) -> None:
        self.pid = pid
        self._rss_mb = rss_mb
        self._step_mb = step_mb

    def memory_info(self) -> SimpleNamespace:
        self._rss_mb += self._step_mb
        return SimpleNamespace(rss=self._rss_mb * 2**20)


def test_one_growing_worker_fails_the_backend_even_when_the_sum_stays_under_the_limit() -> None:
    config = Settings.for_smoke().config(get_workload("cheap"))
    big = Watched("main", _GrowingProcess(1, 1000.0, 0.0))
    leaking = Watched("env worker 0", _GrowingProcess(2, 50.0, 2.0))
    with EnvRunner(config) as runner:
        result = sample_and_watch(
            runner, [big, leaking], start_steps=1_000, end_steps=3_000, every_steps=1_000
        )

    main_row, worker_row = result["processes"]
    assert main_row["ok"] and main_row["growth_pct"] == 0.0
    assert worker_row["growth_pct"] > 5.0 and not worker_row["ok"]
    assert result["growth_pct"] < 5.0 and result["ok"] is False
    assert [len(mark["rss_mb"]) for mark in result["series"]] == [2] * len(result["series"])


def test_sync_watches_only_the_main_process() -> None:
    config = Settings.for_smoke().config(get_workload("cheap"))
    with EnvRunner(config) as runner:
        (main_process,) = watched_processes(runner)
    assert main_process.role == "main" and main_process.process.pid == os.getpid()
