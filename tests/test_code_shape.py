"""The code keeps its shape: small modules, and public methods that say why they exist.

A module over `MAX_LINES` has more than one job; a public method without a
docstring leaves the reader guessing why it is there. Methods that override
a base class's method are exempt: the base documents them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("marl_runner", "connectors")
MAX_LINES = 600

# Methods not documented yet, each named "path:Class.method" (empty: every one is documented).
UNDOCUMENTED_ALLOWED: set[str] = set()


def source_files() -> list[Path]:
    """Every .py file of the packages, sorted, so failures list in a stable order."""
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    """The dotted import name of a file under `ROOT`."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def undocumented_methods(module: types.ModuleType, source: str) -> list[str]:
    """`Class.method` for each public method of a public top-level class of `module` that has
    no docstring and does not override a method of one of the class's bases."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        cls = getattr(module, node.name)
        bases = inspect.getmro(cls)[1:] if inspect.isclass(cls) else ()
        for item in node.body:
            if (
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not item.name.startswith("_")
                and ast.get_docstring(item) is None
                and not _is_property_accessor(item)
                and not any(hasattr(base, item.name) for base in bases)
            ):
                found.append(f"{node.name}.{item.name}")
    return found


def _is_property_accessor(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """`@x.setter` / `@x.deleter`: the getter's docstring covers the property."""
    return any(
        isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
        for d in function.decorator_list
    )


def test_no_module_is_over_the_line_limit() -> None:
    too_long = []
    for path in source_files():
        with path.open(encoding="utf-8") as file:
            length = sum(1 for _ in file)
        if length > MAX_LINES:
            too_long.append(f"{path.relative_to(ROOT)} has {length} lines")
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job): {too_long}"


def test_public_methods_have_docstrings() -> None:
    missing = []
    for path in source_files():
        if path.name == "__main__.py":
            continue  # runs the command line on import
        module = importlib.import_module(module_name(path))
        for method in undocumented_methods(module, path.read_text(encoding="utf-8")):
            missing.append(f"{path.relative_to(ROOT).as_posix()}:{method}")
    new = sorted(set(missing) - UNDOCUMENTED_ALLOWED)
    assert not new, f"public methods without a docstring saying why they exist: {new}"


def test_the_docstring_check_flags_new_methods_and_skips_overrides() -> None:
    source = '''
class Base:
    def run(self):
        """Documented here."""

class Public(Base):
    def run(self):
        pass

    def bare(self):
        pass

    def documented(self):
        """Why it exists."""

    @property
    def size(self):
        """How big."""

    @size.setter
    def size(self, value):
        pass

    def _private(self):
        pass

class _Hidden:
    def bare(self):
        pass
'''
    module = types.ModuleType("shape_example")
    exec(compile(source, "shape_example", "exec"), module.__dict__)
    assert undocumented_methods(module, source) == ["Public.bare"]
