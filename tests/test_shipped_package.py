"""What ships: the wheel holds marl_runner and connectors, with the envs the bench commands
run, and none of the test-only envs (tests/envs), which stay in the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST_ONLY = {path.stem for path in (REPO / "tests" / "envs").glob("*.py")} - {"__init__"}


def _checkout_copy(to: Path) -> Path:
    """The files git would hand a fresh clone (tracked and new, not ignored): a build in
    the checkout itself would write build/ and egg-info beside other tests' runs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def test_the_wheel_ships_the_bench_envs_and_no_test_env(tmp_path: Path) -> None:
    """A real build of the wheel (about 3 s), as pip would install it."""
    assert {"crashing_env", "malformed_env", "lifecycle_envs"} <= TEST_ONLY
    source = _checkout_copy(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("marl_runner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = {Path(name).stem for name in names if name.endswith(".py")}
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith("-info")}
    assert packages == {"marl_runner", "connectors"}
    assert not TEST_ONLY & modules, f"test-only envs in the wheel: {sorted(TEST_ONLY & modules)}"
    for shipped in ("cheap_env", "random_fault_env", "external_envs", "scripted_env"):
        assert f"marl_runner/bench/envs/{shipped}.py" in names
