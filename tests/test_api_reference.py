"""The public names of `marl_runner`: seen by static tools, loaded lazily, and in the
API reference that `scripts/build_api_docs.py` (pdoc) builds without warnings."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import marl_runner
from scripts import build_api_docs

REPO = Path(__file__).resolve().parents[1]


def test_public_names_are_listed_once_as_re_exports_and_load_from_that_list() -> None:
    """The TYPE_CHECKING block is the one list: type checkers read it, and so does
    `__getattr__` (through `_EXPORTS`)."""
    tree = ast.parse((REPO / "marl_runner" / "__init__.py").read_text())
    (block,) = (
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    listed = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            # `X as X`: the form type checkers take as a re-export
            assert alias.asname == alias.name, f"import {alias.name} as {alias.name}"
            listed[alias.name] = node.module
    assert listed == marl_runner._EXPORTS
    assert marl_runner.__all__ == sorted(listed)
    assert "_EXPORTS = {" not in (REPO / "marl_runner" / "__init__.py").read_text()


def test_the_extension_points_users_need_are_public() -> None:
    for name in (
        "register_env",
        "register_connector",
        "register_vector_backend",
        "EnvRunnerGroup",
        "read_batches",
    ):
        assert name in marl_runner.__all__, name
        assert callable(getattr(marl_runner, name)), name


def test_the_version_is_pyprojects_and_the_cli_prints_it() -> None:
    # pyproject.toml is the one place the version is written (tomllib is Python 3.11+).
    written = re.findall(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert len(written) == 1, written
    assert marl_runner.__version__ == written[0]
    result = subprocess.run(
        [sys.executable, "-m", "marl_runner.cli", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"marl-runner {written[0]}"


def test_every_public_name_resolves_to_its_module_object() -> None:
    for name, module in marl_runner._EXPORTS.items():
        assert getattr(marl_runner, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'EnvRuner'"):
        marl_runner.EnvRuner  # noqa: B018


def test_importing_the_package_does_not_import_torch() -> None:
    """Env worker processes import marl_runner; torch would cost each one ~190 MB."""
    code = "import sys, marl_runner.envs; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.slow
def test_api_reference_builds_without_warnings(tmp_path) -> None:
    assert build_api_docs.build(tmp_path) == []
    top = (tmp_path / "marl_runner.html").read_text()
    for name in marl_runner.__all__:
        assert f'id="{name}"' in top, f"{name} missing from the API reference"
    for module in build_api_docs.PUBLIC_MODULES:
        assert (tmp_path / (module.replace(".", "/") + ".html")).is_file(), module
    group = (tmp_path / "marl_runner" / "distributed.html").read_text()
    assert 'id="EnvRunnerGroup"' in group


def test_a_pdoc_warning_fails_the_build(tmp_path, monkeypatch) -> None:
    """The script's exit code is what CI (`make docs`) checks."""
    monkeypatch.setattr(build_api_docs, "build", lambda out_dir: ["Error parsing type X for y"])
    assert build_api_docs.main([str(tmp_path)]) == 1
    monkeypatch.setattr(build_api_docs, "build", lambda out_dir: [])
    assert build_api_docs.main([str(tmp_path)]) == 0
