"""SIGTERM stops a command the way Ctrl-C does.

A scheduler (Slurm, `timeout`, `docker stop`, systemd) stops a process with
SIGTERM, whose default action ends it on the spot: no summary, and the
metrics log without its last record. While a command runs, the first
SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread
instead, so every command's Ctrl-C path runs; it exits 143 (128 + 15).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from marl_runner.cli.common import EXIT_INTERRUPTED

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """The command got SIGTERM."""


def exit_code_of(interrupt: KeyboardInterrupt) -> int:
    """130 after Ctrl-C, 143 after SIGTERM."""
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` while the block runs. Later SIGTERMs are ignored, so
    the clean-up the first one starts (files completed, the last record) is not cut
    short; SIGKILL still ends the process. Outside the main thread (where Python takes
    no signal handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
