"""Which CPU this process runs on, so the parent can wake its pinned workers in a good order.

Writing a worker's request to its pipe wakes the worker; when the worker is
pinned to the CPU the parent is running on, the kernel soon hands that CPU to
the worker and the parent waits for it (measured on cheap, 2 CPUs: ~0.7 ms
median, ~1.4 ms mean per round) before it gets to send the other worker its
request. Sending to the workers on other CPUs first, and to the one on this
CPU last, gives every worker its request at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

_sched_getcpu: Callable[[], int] | None
try:
    _sched_getcpu = ctypes.CDLL(None).sched_getcpu
    _sched_getcpu.restype = ctypes.c_int
    _sched_getcpu.argtypes = ()
except (AttributeError, OSError, TypeError):  # not glibc / not Linux
    _sched_getcpu = None


def current_cpu() -> int | None:
    """The CPU this thread runs on now (it may move any time), or None if unknown."""
    if _sched_getcpu is None:
        return None
    cpu = _sched_getcpu()
    return cpu if cpu >= 0 else None
