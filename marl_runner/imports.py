"""Resolve ``"pkg.mod:attr"`` strings from config files to Python objects.

Config files name user code (mapping functions, callbacks, models, envs) by
import path. The helper lives in ``connectors.imports`` (the lower layer, so
both packages share one without an import cycle); this module re-exports it.
"""

from connectors.imports import ImportPathError, import_object, split_import_path

__all__ = ["ImportPathError", "import_object", "split_import_path"]
