"""An env class or function given directly as ``env.name`` in a Python config.

A config stays plain data (``to_dict``, checkpoints, worker processes), so
the callable is turned into a name when the config is checked:

- one with an import path (defined at the top level of an importable module)
  becomes ``'module:qualname'``, exactly as if the YAML had named it;
- one without (defined in ``__main__``, a lambda, a local class) is
  registered in this process with ``marl_runner.envs.register_env`` as
  ``'<module>.<qualname>'`` (e.g. ``'__main__.Hive'``), called with
  ``env.config`` as keyword arguments like an import path is. Worker
  processes get the creator with the env factory; a class from ``__main__``
  pickles by reference, so ``vectorize: subprocess`` works for scripts (not
  for lambdas or local classes: use ``sync`` or give them an import path).
  A config saved from it names ``'__main__.Hive'`` and loads again where the
  same class is passed again (re-running the script) or registered under
  that name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from connectors.imports import import_path_of

__all__ = ["KeywordCreator", "env_name_of"]


class KeywordCreator:
    """A registered creator that calls ``fn(**env_config)``, as an import path would be.

    Registered creators are called with the config as one argument (RLlib's
    ``creator(env_config)``); a class passed as ``env.name`` takes keyword
    arguments like its import path would. Picklable whenever ``fn`` is.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, env_config: Mapping[str, Any]) -> Any:
        return self.fn(**env_config)


def env_name_of(fn: Callable[..., Any]) -> str:
    """The ``env.name`` string that stands for ``fn`` (registering ``fn`` when it has no path)."""
    path = import_path_of(fn)
    if path is not None:
        return path
    from marl_runner.envs import register_env  # only here: the env package is not light

    module = getattr(fn, "__module__", None) or "unknown"
    qualname = getattr(fn, "__qualname__", None)
    name = f"{module}.{qualname or type(fn).__qualname__}".replace(":", ".")
    if qualname is None or "<" in qualname:  # lambdas, local classes, partials share names
        name = f"{name}@{id(fn):x}"
    register_env(name, KeywordCreator(fn))
    return name
