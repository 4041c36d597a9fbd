"""Running a hostile input in a child process under a memory cap, and reading its peak RSS.

Memory is the point of these tests, so it is measured where nothing else
runs: the child sets ``RLIMIT_AS`` (an allocation past the cap fails there,
not on the machine) and reports its own peak RSS (``VmHWM``) on its last line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20

_PRELUDE = """\
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
"""
# VmHWM, not ru_maxrss: ru_maxrss keeps the forking parent's peak across exec.
_EPILOGUE = """
for _line in open("/proc/self/status"):
    if _line.startswith("VmHWM:"):
        print(json.dumps({"peak_rss_kib": int(_line.split()[1])}))
"""


@dataclass
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mib: float | None  # None when the child died before its last line


def run_capped(code: str, *, cap_mib: int, timeout_s: float = 60.0) -> ChildResult:
    """Runs ``code`` in a fresh interpreter with at most ``cap_mib`` of address space."""
    script = (
        _PRELUDE.format(cap=cap_mib * MIB)
        + "try:\n"
        + textwrap.indent(textwrap.dedent(code), "    ")
        + "\nfinally:"
        + textwrap.indent(_EPILOGUE, "    ")
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
    )
    lines = done.stdout.strip().splitlines()
    peak = None
    if lines and lines[-1].startswith('{"peak_rss_kib"'):
        peak = json.loads(lines[-1])["peak_rss_kib"] / 1024
        lines = lines[:-1]
    return ChildResult(done.returncode, "\n".join(lines), done.stderr, peak)
