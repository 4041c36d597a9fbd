"""Which import paths a checkpoint would make a runner import, so restoring can refuse them.

A checkpoint is data, but a config names code by import path (``env.name``,
``policy_mapping_fn``, ``callbacks``, ``policy_class``, ``model.class``,
``module:Class`` connectors and the ``fn`` of lambda connectors) and building a
runner imports and calls it. Anyone can write a file with a valid checksum, so
``restore_checkpoint`` imports such a path only when the caller vouched for it
(see its docstring). Registered env and connector names and the built-in
names below are data, not imports: they only pick code this process already
chose to run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from connectors.errors import ConnectorError
from connectors.function_connector import FunctionConnector
from connectors.registry import connector_class, parse_spec, registered_names
from marl_runner.config import BUILTIN_POLICY_CLASSES, RunnerConfig

__all__ = ["BUILTIN_ENV_NAME", "ImportRef", "chain_imports", "config_imports"]

#: ``(dotted key, import path)``: where a config or connector state names code.
ImportRef = tuple[str, str]

#: Env constructors that ship with PettingZoo and MPE2 (``pettingzoo.classic.connect_four_v3:env``):
#: built-in names, allowed by default. Their keyword arguments (``env.config``) are data.
BUILTIN_ENV_NAME = re.compile(
    r"(?:pettingzoo\.(?:atari|butterfly|classic|mpe|sisl)|mpe2)\.[a-z][a-z0-9_]*_v\d+"
    r":(?:env|parallel_env|raw_env)"
)


def config_imports(config: RunnerConfig, prefix: str = "config.") -> list[ImportRef]:
    """Every import path ``EnvRunner(config)`` would import, with its dotted key.

    Covers the same keys as ``RunnerConfig.check_imports`` plus the ``fn`` of
    lambda connectors, which only their constructor imports.
    """
    refs: list[ImportRef] = []
    env_name = config.env["name"]
    if ":" in env_name and not BUILTIN_ENV_NAME.fullmatch(env_name):
        refs.append((f"{prefix}env.name", env_name))
    if isinstance(config.policy_mapping_fn, str):
        refs.append((f"{prefix}policy_mapping_fn", config.policy_mapping_fn))
    if config.callbacks is not None:
        refs.append((f"{prefix}callbacks", config.callbacks))
    for pid, spec in config.policies.items():
        key = f"{prefix}policies.{pid}"
        if spec["policy_class"] not in (None, *BUILTIN_POLICY_CLASSES):
            refs.append((f"{key}.policy_class", spec["policy_class"]))
        if "class" in spec["model"]:
            refs.append((f"{key}.model.class", str(spec["model"]["class"])))
        for kind in ("agent", "action"):
            refs += chain_imports(spec[f"{kind}_connectors"] or [], f"{key}.{kind}_connectors")
    return refs


def chain_imports(items: Sequence[Any], key: str) -> list[ImportRef]:
    """Import paths in a connector spec list or pipeline state (``[(name, params), ...]``).

    Raises:
        ValueError: ``items`` is not a list of connector specs (the message names ``key``).
    """
    if not isinstance(items, list | tuple):
        raise ValueError(f"{key} is {type(items).__name__}, expected a list of connector specs")
    refs: list[ImportRef] = []
    for i, item in enumerate(items):
        try:
            name, params = parse_spec(item, i)
        except ConnectorError as err:
            raise ValueError(f"{key}[{i}]: {err}") from None
        if ":" in name:
            refs.append((f"{key}[{i}]", name))
        fn = params.get("fn")
        if isinstance(fn, str) and _may_import_fn(name):
            refs.append((f"{key}[{i}].fn", fn))
    return refs


def _may_import_fn(name: str) -> bool:
    """Whether connector ``name`` imports its ``fn`` parameter: lambda connectors do, and an
    unregistered class (named by import path) is assumed to."""
    if name not in registered_names():
        return True
    return issubclass(connector_class(name), FunctionConnector)
