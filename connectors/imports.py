"""``module:attribute`` import paths, so configs can name user code.

The one import helper of the project: connectors are the lower layer, so
both packages can use it without a cycle.
Resolving is ``pkgutil.resolve_name``; what this adds is errors that say
which step broke (malformed path, missing module, a module that fails while
importing, missing attribute) instead of a bare ``AttributeError``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

__all__ = ["ImportPathError", "import_object", "import_path_of", "split_import_path"]


class ImportPathError(ImportError):
    """An import path that is malformed, names a missing module, or a missing attribute."""


def split_import_path(path: str) -> tuple[str, str]:
    """Splits ``path`` into ``(module, attr)`` without importing anything.

    Lets a config be checked for shape when it is loaded, while the import
    itself waits until the object is needed.

    Raises:
        ImportPathError: ``path`` is not a string of the form ``module:attr``
            (or ``module.attr``).
    """
    if not isinstance(path, str) or not path.strip():
        raise ImportPathError(f"import path must be a non-empty 'module:attr' string, got {path!r}")
    path = path.strip()
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path or ":" in attr_path or " " in path:
        raise ImportPathError(
            f"malformed import path {path!r}: expected 'module:attr', e.g. 'examples.mappings:by_prefix'"
        )
    return module_name, attr_path


def import_object(path: str) -> Any:
    """Returns the object named by ``path``.

    ``"pkg.mod:attr"`` is the documented form; ``attr`` may be dotted
    (``"pkg.mod:Cls.method"``). The dotted form ``"pkg.mod.attr"`` is also
    accepted because RLlib users write it, but it is ambiguous for nested
    attributes, so the colon form is what error messages suggest.

    Raises:
        ImportPathError: the path is malformed, its module cannot be imported
            (the message says whether it is missing or failed while importing),
            or the module lacks the attribute.
    """
    module_name, attr_path = split_import_path(path)
    path = path.strip()
    try:
        return pkgutil.resolve_name(path)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _is_module_or_parent(exc.name, module_name):
            raise ImportPathError(
                f"cannot import {path!r}: no module named {exc.name!r} "
                f"(is it installed, or is its directory on sys.path?)",
                name=module_name,
            ) from exc
        raise ImportPathError(
            f"cannot import {path!r}: module {module_name!r} failed to import: {exc}",
            name=module_name,
        ) from exc
    except AttributeError as exc:
        raise ImportPathError(
            f"cannot import {path!r}: {_missing_attribute(module_name, attr_path) or exc}",
            name=module_name,
        ) from None
    except Exception as exc:
        raise ImportPathError(
            f"cannot import {path!r}: module {module_name!r} failed to import: "
            f"{type(exc).__name__}: {exc}",
            name=module_name,
        ) from exc


def import_path_of(obj: Any) -> str | None:
    """The import path that ``import_object`` resolves back to ``obj``, if there is one."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    path = f"{module}:{qualname}"
    try:
        return path if import_object(path) is obj else None
    except ImportPathError:
        return None


def _missing_attribute(module_name: str, attr_path: str) -> str | None:
    """``"'pkg.mod.Cls' has no attribute 'x'"``: the first step of ``attr_path`` that is missing."""
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception:  # the dotted form may name no module at all: keep resolve_name's words
        return None
    resolved = module_name
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            return f"{resolved!r} has no attribute {part!r}"
        obj = getattr(obj, part)
        resolved = f"{resolved}.{part}"
    return None


def _is_module_or_parent(missing: str, module_name: str) -> bool:
    """Whether the missing module is the one asked for (not a dependency it imports)."""
    return module_name == missing or module_name.startswith(missing + ".")
