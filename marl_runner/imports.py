"""Resolve ``"pkg.mod:attr"`` strings from config files to Python objects.

Config files name user code (mapping functions, callbacks, models, envs) by
import path. Failing here with the path and the step that broke beats a bare
``AttributeError`` from deep inside the runner.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ImportPathError", "import_object", "split_import_path"]


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
    try:
        module = importlib.import_module(module_name)
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
    except Exception as exc:
        raise ImportPathError(
            f"cannot import {path!r}: module {module_name!r} failed to import: "
            f"{type(exc).__name__}: {exc}",
            name=module_name,
        ) from exc

    obj: Any = module
    resolved = module_name
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportPathError(
                f"cannot import {path!r}: {resolved!r} has no attribute {part!r}",
                name=module_name,
            ) from None
        resolved = f"{resolved}.{part}"
    return obj


def _is_module_or_parent(missing: str, module_name: str) -> bool:
    """Whether the missing module is the one asked for (not a dependency it imports)."""
    return module_name == missing or module_name.startswith(missing + ".")
