"""How much CPU other processes took while the bench measured.

A ratio compares two loops timed one after the other on the same cores, so
other work on the machine shifts it by more than the targets' margins: on the
2-core machine, simple_spread read 0.88 beside two busy processes and 0.93
alone. The report therefore says how many CPUs the rest of the machine used,
and warns when that is enough to make the figures unreliable.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any

import psutil

#: Other processes using more than this many CPUs on average: the report warns.
BUSY_CPUS = 0.25


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds the whole machine and this process tree had used, at one moment."""

    wall_s: float
    machine_busy_s: float
    own_s: float


def take_sample() -> CpuSample:
    """The machine's busy CPU seconds (steal included: a hypervisor's other guests slow
    the bench as much as local processes do) and this process tree's own."""
    machine = psutil.cpu_times()
    busy = sum(
        getattr(machine, field, 0.0)
        for field in ("user", "nice", "system", "irq", "softirq", "steal")
    )
    return CpuSample(perf_counter(), busy, _own_cpu_s())


def other_cpus(start: CpuSample, end: CpuSample) -> float:
    """Average number of CPUs used by processes other than this tree between two samples."""
    wall = end.wall_s - start.wall_s
    if wall <= 0:
        return 0.0
    others = (end.machine_busy_s - start.machine_busy_s) - (end.own_s - start.own_s)
    return max(others, 0.0) / wall


def load_note(others: float, cpu_count: int | None) -> str | None:
    """The report's warning when other processes were busy enough to skew the ratios."""
    if others <= BUSY_CPUS:
        return None
    return (
        f"other processes used {others:.2f} of {cpu_count or '?'} CPUs on average while the "
        "bench ran: the ratios and speedups above are unreliable; rerun on a quiet machine"
    )


def _own_cpu_s() -> float:
    """CPU seconds of this process, its reaped children, and its live descendants
    (env workers, Ray's processes)."""
    process = psutil.Process()
    total = _with_reaped(process.cpu_times())
    for child in process.children(recursive=True):
        try:
            # A descendant's reaped children count with it: when they end, their time
            # moves into its children_* and must not vanish from the tree's total.
            total += _with_reaped(child.cpu_times())
        except psutil.Error:  # it ended in between: its time is in children_* once reaped
            continue
    return total


def _with_reaped(times: Any) -> float:
    """A ``psutil`` cpu_times tuple's own and reaped children's seconds."""
    return times.user + times.system + times.children_user + times.children_system
