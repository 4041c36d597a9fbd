"""Every ```python and ```bash block of README.md and docs/*.md runs as written.

A page is run top to bottom, as a reader would: its python blocks share one
namespace (in one worker process, `docs_snippet_worker.py`, that imports torch
once for all pages), and its shell blocks run with bash in the page's own
working directory, which holds links to `examples/` and
`scripts/`, with `.venv/bin` first on PATH. Each block is one test; it first
runs the blocks above it on its page that have not run yet (a fast block only
the fast ones).

Shell blocks run with their step counts made small (`STEP_FLAGS`): what is
tested is that the command works as written, not how long it runs. A comment
right before a block changes how it runs:

    <!-- docs-test: slow -->            it takes long or starts a Ray: `make test-all` runs it
    <!-- docs-test: skip: REASON -->    it cannot run in a test (REASON says why)
    <!-- docs-test: save-as: NAME -->   the page asks the reader to save it as NAME: it is
                                        saved there in the page's directory, then run

The block is the one that starts on the next line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "bash": "shell", "shell": "shell", "sh": "shell"}
LINKED = ("examples", "scripts", ".venv")
BLOCK_TIMEOUT_S = 600
_FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(slow|skip|save-as)\s*(?::\s*(.*?))?\s*-->\s*$")
#: A shell block's step counts, made small: (flag, the most it runs).
STEP_FLAGS = {"--steps": 400, "--episodes": 2, "--total-env-steps": 2048, "--duration": 1}


@dataclass
class Block:
    page: Path
    line: int
    language: str  # "python" or "shell"
    code: str
    mode: str = "fast"  # "fast", "slow" or "skip"
    reason: str = ""
    save_as: str = ""

    @property
    def name(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The page's python and shell blocks, in order, with the marker before each."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        language = LANGUAGES.get(match.group(2))
        if language is None:
            continue
        line = text.count("\n", 0, match.start()) + 1
        block = Block(page, line, language, textwrap.dedent(match.group(3)))
        before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        marker = _MARKER.search(before)
        if marker and marker.group(1) == "save-as":
            block.save_as = marker.group(2)
        elif marker:
            block.mode, block.reason = marker.group(1), marker.group(2) or ""
            assert block.mode != "skip" or block.reason, f"{block.name}: say why it is skipped"
        blocks.append(block)
    return blocks


def shrink_steps(code: str) -> str:
    """`--steps 20000` -> `--steps 400`, and so on for each flag of `STEP_FLAGS`."""
    for flag, most in STEP_FLAGS.items():
        code = re.sub(
            rf"(?<![\w-]){re.escape(flag)}([ =])(\d[\d_]*)",
            lambda m, flag=flag, most=most: f"{flag}{m.group(1)}{min(int(m.group(2)), most)}",
            code,
        )
    return code


BLOCKS = [block for page in PAGES for block in page_blocks(page)]


@dataclass
class PageRun:
    """A page's working directory and which of its blocks ran, with their errors."""

    workdir: Path
    done: dict[int, str | None] = field(default_factory=dict)


class Runner:
    """Runs blocks page by page: python in the worker process, shell in bash."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pages: dict[Path, PageRun] = {}
        self.env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.log = root / "worker.log"
        self.log.touch()
        self.log_start = 0
        self.worker: subprocess.Popen | None = None
        # Process groups of the shell blocks run (one per block), stopped by close().
        self.sessions: list[int] = []

    def run(self, block: Block) -> str | None:
        """Runs the block (after the not yet run blocks above it); its error, or None."""
        page = self.page_run(block.page)
        allowed = {"fast"} if block.mode == "fast" else {"fast", "slow"}
        for earlier in page_blocks(block.page):
            if earlier.line >= block.line:
                break
            if earlier.mode in allowed and earlier.line not in page.done:
                page.done[earlier.line] = self._run_one(earlier, page)
        page.done[block.line] = self._run_one(block, page)
        return page.done[block.line]

    def page_run(self, page: Path) -> PageRun:
        if page not in self.pages:
            workdir = self.root / page.stem
            workdir.mkdir()
            for name in LINKED:
                (workdir / name).symlink_to(REPO / name)
            self.pages[page] = PageRun(workdir)
        return self.pages[page]

    def _run_one(self, block: Block, page: PageRun) -> str | None:
        if block.save_as:
            (page.workdir / block.save_as).write_text(block.code)
        if block.language == "shell":
            return self._run_shell(block, page.workdir)
        return self._run_python(block, page.workdir)

    def _run_shell(self, block: Block, workdir: Path) -> str | None:
        code = shrink_steps(block.code)
        try:
            # A session of its own: what the block starts in the background (a server for
            # the next block) keeps its process group, which close() stops.
            shell = subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", "-c", code],
                cwd=workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            self.sessions.append(shell.pid)
            stdout, stderr = shell.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"did not finish in {BLOCK_TIMEOUT_S} s:\n{code}"
        if shell.returncode != 0:
            return f"exit {shell.returncode}:\n{code}\n{(stdout + stderr)[-4000:]}"
        return None

    def _run_python(self, block: Block, workdir: Path) -> str | None:
        worker = self._worker()
        self.log_start = self.log.stat().st_size
        request = {
            "page": str(block.page),
            "name": block.name,
            "code": block.code,
            "cwd": str(workdir),
            "script": str(workdir / "page_script.py"),
        }
        worker.stdin.write(json.dumps(request) + "\n")
        worker.stdin.flush()
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while not select.select([worker.stdout], [], [], 1.0)[0]:
            if worker.poll() is not None or time.monotonic() > deadline:
                self.close()
                return f"the worker died or timed out; its output:\n{self._log_tail()}"
        answer = worker.stdout.readline()
        if not answer:
            self.close()
            return f"the worker died; its output:\n{self._log_tail()}"
        error = json.loads(answer)["error"]
        return None if error is None else f"{error}\noutput:\n{self._log_tail()}"

    def _worker(self) -> subprocess.Popen:
        if self.worker is None:
            self.worker = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("docs_snippet_worker.py"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log.open("a"),
                env=self.env,
                cwd=self.root,
                text=True,
            )
        return self.worker

    def _log_tail(self) -> str:
        """What the worker printed while running the last block (its end)."""
        with self.log.open("rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        for group in self.sessions:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGTERM)
        self.sessions.clear()
        if self.worker is not None:
            self.worker.stdin.close()
            try:
                self.worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
            self.worker = None


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> Runner:
    runner = Runner(tmp_path_factory.mktemp("docs"))
    yield runner
    runner.close()


def _param(block: Block):
    marks = {"slow": [pytest.mark.slow], "skip": [pytest.mark.skip(reason=block.reason)]}
    return pytest.param(block, id=block.name, marks=marks.get(block.mode, []))


@pytest.mark.parametrize("block", [_param(block) for block in BLOCKS])
def test_docs_block_runs(block: Block, runner: Runner) -> None:
    error = runner.run(block)
    assert error is None, f"{block.name} ({block.language}) fails:\n{error}"


def test_blocks_and_markers_are_found(tmp_path) -> None:
    page = tmp_path / "PAGE.md"
    page.write_text(
        "text\n```python\nx = 1\n```\n<!-- docs-test: slow -->\n```bash\nls\n```\n"
        "<!-- docs-test: skip: needs a GPU -->\n  ```python\n  y = 2\n  ```\n```yaml\na: 1\n```\n"
    )
    blocks = page_blocks(page)
    assert [(b.line, b.language, b.code, b.mode, b.reason) for b in blocks] == [
        (2, "python", "x = 1\n", "fast", ""),
        (6, "shell", "ls\n", "slow", ""),
        (10, "python", "y = 2\n", "skip", "needs a GPU"),
    ]


def test_step_counts_are_made_small() -> None:
    assert (
        shrink_steps("marl-runner sample c.yaml --steps 20000 --episodes=100 --out runs/x")
        == "marl-runner sample c.yaml --steps 400 --episodes=2 --out runs/x"
    )
    assert shrink_steps("train.py --total-env-steps 300_000 --eval-steps 9") == (
        "train.py --total-env-steps 2048 --eval-steps 9"
    )


def test_a_failing_block_is_reported_with_its_page_and_line(tmp_path) -> None:
    page = tmp_path / "BAD.md"
    page.write_text("```python\nok = 1\n```\n\n```python\nprint(ok)\nnot_defined\n```\n")
    (tmp_path / "run").mkdir()
    runner = Runner(tmp_path / "run")
    try:
        first, second = page_blocks(page)
        error = runner.run(second)  # runs the first block too: the page shares a namespace
        assert runner.pages[page].done[first.line] is None
        assert "NameError: name 'not_defined' is not defined" in error
        assert f"{page}:5" in error  # the block's page and line, in the traceback
    finally:
        runner.close()
