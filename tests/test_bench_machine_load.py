"""The bench says how busy the rest of the machine was, and warns when it skews the figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from marl_runner.bench.cli import main  # noqa: E402
from marl_runner.bench.machine_load import (  # noqa: E402
    BUSY_CPUS,
    CpuSample,
    load_note,
    other_cpus,
    take_sample,
)


def test_other_cpus_is_machine_time_minus_own_time_per_second() -> None:
    start = CpuSample(wall_s=10.0, machine_busy_s=100.0, own_s=40.0)
    end = CpuSample(wall_s=12.0, machine_busy_s=103.0, own_s=41.5)

    # 3 s of CPU on the machine in 2 s, 1.5 of them ours: others used 0.75 CPUs.
    assert other_cpus(start, end) == pytest.approx(0.75)
    # Clock granularity can make own time exceed the machine's: never negative.
    assert other_cpus(start, CpuSample(11.0, 100.5, 41.0)) == 0.0
    assert other_cpus(start, start) == 0.0


def test_note_only_when_others_were_busy() -> None:
    assert load_note(BUSY_CPUS, 2) is None
    note = load_note(1.3, 2)
    assert note is not None and "1.30 of 2 CPUs" in note and "unreliable" in note


def test_a_busy_child_process_counts_as_the_bench_s_own() -> None:
    """Env workers and Ray processes are the bench's own work, not other load."""
    start = take_sample()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.6\n"
         "while time.process_time() < end: pass"]
    )
    try:
        time.sleep(0.1)
        during = take_sample()  # the child is alive: counted as a live descendant
    finally:
        child.wait(timeout=60)
    end = take_sample()  # reaped: counted in children_*
    assert during.own_s >= start.own_s
    assert end.own_s - start.own_s >= 0.5


def test_the_report_carries_the_load_and_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke", "--json", "cheap"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    others = report["meta"]["other_cpus"]
    assert isinstance(others, float) and others >= 0.0
    # Rich wraps the line at the console's width: compare with the wrapping undone.
    assert "other processes used" in " ".join(captured.err.split())
