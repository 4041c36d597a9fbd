"""`marl-runner serve` in a subprocess for tests: start it, find its address, stop it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRONES_CONFIG = REPO / "examples" / "configs" / "serve_drones.yaml"


class ServeProcess:
    """A running `marl-runner serve` and what it printed so far."""

    def __init__(self, process: subprocess.Popen, address: str, lines: list[str]) -> None:
        self.process = process
        self.address = address
        self.lines = lines

    def finish(self, sig: int | None, timeout_s: float = 60.0) -> str:
        """Sends `sig` (None: waits for a target to stop it); checks exit 0; returns all output."""
        if sig is not None:
            self.process.send_signal(sig)
        rest, _ = self.process.communicate(timeout=timeout_s)
        output = "".join(self.lines) + rest
        assert self.process.returncode == 0, output
        return output


@contextmanager
def serve_process(*args: str, config: Path = DRONES_CONFIG) -> Iterator[ServeProcess]:
    """`marl-runner serve CONFIG *args`; killed on the way out if still running."""
    process = subprocess.Popen(
        [sys.executable, "-m", "marl_runner.cli", "serve", str(config), *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        lines: list[str] = []
        for line in process.stdout:
            lines.append(line)
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if found:
                yield ServeProcess(process, found.group(1), lines)
                return
        raise AssertionError("serve did not start:\n" + "".join(lines))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def free_port() -> int:
    """A port free right now on 127.0.0.1 (for a server restarted on the same port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
