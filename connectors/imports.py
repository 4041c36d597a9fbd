"""``module:attribute`` import paths, so configs can name user code."""

from __future__ import annotations

import importlib
from typing import Any

from connectors.errors import ConnectorError


def import_object(path: str) -> Any:
    """The object at ``"package.module:attr"`` (``attr`` may be dotted)."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConnectorError(f"import path {path!r} must look like 'package.module:Name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ConnectorError(f"cannot import module {module_name!r} of {path!r}: {err}") from err
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ConnectorError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def import_path_of(obj: Any) -> str | None:
    """The import path that ``import_object`` resolves back to ``obj``, if there is one."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    path = f"{module}:{qualname}"
    try:
        return path if import_object(path) is obj else None
    except ConnectorError:
        return None
