"""import_object: resolving "module:attr" strings from configs, with clear failures."""

from __future__ import annotations

import os.path
import sys
from pathlib import Path

import pytest

from connectors.imports import ImportPathError, import_object, split_import_path


def test_colon_and_dotted_forms() -> None:
    assert import_object("os.path:join") is os.path.join
    assert import_object("os.path.join") is os.path.join
    assert import_object("connectors.imports:import_object") is import_object


def test_nested_attribute_after_colon() -> None:
    from collections import OrderedDict

    assert import_object("collections:OrderedDict.fromkeys") == OrderedDict.fromkeys


def test_errors_are_import_errors() -> None:
    assert issubclass(ImportPathError, ImportError)


@pytest.mark.parametrize("path", ["", "   ", "nomodule", ":attr", "mod:", "a:b:c", "a b:c", 3])
def test_malformed_paths(path: object) -> None:
    with pytest.raises(ImportPathError, match="module:attr"):
        import_object(path)  # type: ignore[arg-type]


def test_missing_module_names_it() -> None:
    with pytest.raises(ImportPathError) as info:
        import_object("no_such_pkg_xyz.sub:thing")
    message = str(info.value)
    assert "'no_such_pkg_xyz.sub:thing'" in message
    assert "no module named 'no_such_pkg_xyz'" in message


def test_missing_attribute_names_it() -> None:
    with pytest.raises(ImportPathError, match=r"'os\.path' has no attribute 'joinn'"):
        import_object("os.path:joinn")
    with pytest.raises(ImportPathError, match=r"'os\.path\.join' has no attribute 'x'"):
        import_object("os.path:join.x")


def test_module_that_fails_while_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_mod_xyz.py").write_text("import missing_dependency_xyz\n")
    (tmp_path / "raising_mod_xyz.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ImportPathError, match="'broken_mod_xyz' failed to import.*missing_dependency_xyz"
    ):
        import_object("broken_mod_xyz:f")
    with pytest.raises(
        ImportPathError, match="'raising_mod_xyz' failed to import: RuntimeError: boom"
    ):
        import_object("raising_mod_xyz:f")
    for name in ("broken_mod_xyz", "raising_mod_xyz"):
        sys.modules.pop(name, None)


def test_split_import_path_does_not_import() -> None:
    assert split_import_path("not_installed_xyz.mod:Cls.attr") == (
        "not_installed_xyz.mod",
        "Cls.attr",
    )
    assert split_import_path(" a.b.c ") == ("a.b", "c")
    with pytest.raises(ImportPathError):
        split_import_path("plain")
