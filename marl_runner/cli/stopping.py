"""SIGTERM stops a command the way Ctrl-C does.

A scheduler (Slurm, `timeout`, `docker stop`, systemd) stops a process with
SIGTERM, whose default action ends it on the spot: no summary, and the
metrics log without its last record. While a command runs, the first
SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread
instead, so every command's Ctrl-C path runs; it exits 143 (128 + 15).
While `sample` samples, ``GracefulStop`` takes both signals over: the first
asks the run to stop after its round and write what it sampled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from marl_runner.cli.common import EXIT_INTERRUPTED, EXIT_OK

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


class GracefulStop:
    """While a run samples, the first Ctrl-C, SIGTERM or SIGHUP asks it to stop (``on_request``,
    which only sets flags) so that it writes what it has sampled, finished episodes
    included; a second one stops it at once (``KeyboardInterrupt`` / ``Terminated``), for
    an env that hangs, unless it comes while a batch is written (``writing``). Outside
    the main thread it installs nothing."""

    # SIGHUP: the terminal closed (an SSH connection dropped), handled as SIGTERM.
    _SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, on_request: Callable[[], None]) -> None:
        self._on_request = on_request
        self._previous: dict[int, object] = {}
        self._sigterm_seen = False
        self._writing = False
        self._waited = False
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """0 while no stop was asked for; else 128 + the signal: 130 after Ctrl-C, 143 after
        SIGTERM, 129 after SIGHUP."""
        return EXIT_OK if self.signum is None else 128 + self.signum

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in self._SIGNALS:  # one by one: each is restored even if the next comes
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            if signum == signal.SIGTERM and self._sigterm_seen:
                # As sigterm_as_interrupt does: the clean-up a SIGTERM started is not cut short.
                handler = signal.SIG_IGN
            signal.signal(signum, handler)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """While the block writes sampled rows (no env is stepped, so nothing there
        hangs), the next Ctrl-C or SIGTERM after the first waits for it: stopping at once
        would lose the batch being written, finished episodes and all. The run stops once
        the block is done, as the first signal asked; one more signal stops it at once."""
        self._writing, self._waited = True, False
        try:
            yield
        finally:
            self._writing = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        terminated = signum in (signal.SIGTERM, signal.SIGHUP)
        self._sigterm_seen = self._sigterm_seen or terminated
        if self.signum is not None and self._writing and not self._waited:
            self._waited = True
            _say("\nstopping: still writing what was sampled (again to stop at once)\n")
            return
        if self.signum is not None:
            if terminated:
                signal.signal(signum, signal.SIG_IGN)  # the clean-up is not cut short
                raise Terminated
            raise KeyboardInterrupt
        self.signum = signum
        self._on_request()
        _say("\nstopping: writing what was sampled (again to stop at once)\n")


def _say(text: str) -> None:
    """To stderr from a signal handler; after a hang-up the terminal may be gone."""
    with contextlib.suppress(OSError):
        os.write(2, text.encode())
