"""YAML in and out: the strict loader, plain data for ``to_dict``, and ``--set`` overrides.

Configs are edited by hand, so loading refuses what PyYAML would silently
accept (a duplicate key keeps the last value) and reads ``1e-3`` as the
number it looks like; writing turns numpy values, tuples and spaces into
plain YAML-safe data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

from marl_runner.config.errors import ConfigError, kind_of
from marl_runner.config.spaces import space_to_spec

__all__ = ["StrictLoader", "describe_yaml_error", "parse_override", "plain", "set_dotted"]


def plain(value: Any) -> Any:
    """Deep copy into YAML-safe builtins (numpy scalars and tuples included)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, gym.Space):
        return space_to_spec(value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ConfigError(
        None, f"cannot write a {type(value).__name__} ({value!r}) to a config; expected plain data"
    )


def parse_override(override: str) -> tuple[str, Any]:
    """``"a.b=[1, 2]"`` -> ``("a.b", [1, 2])``: the value is YAML, as a config file would hold."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            None, f"override {override!r}: expected 'dotted.key=value', e.g. 'num_envs=8'"
        )
    try:
        return key, yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            key, f"override {override!r}: the value is not valid YAML ({describe_yaml_error(exc)})"
        ) from None


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Sets ``data[a][b] = value`` for ``key`` ``"a.b"``, making missing mappings on the way."""
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                where, f"cannot set {key!r}: {where!r} holds {kind_of(child)}, not a mapping"
            )
        node = child
    node[parts[-1]] = value


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last) and reads
    ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3`` and would give the string "1e-3")."""


StrictLoader.yaml_implicit_resolvers = {
    first: list(resolvers) for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _construct_mapping_without_duplicates(
    loader: StrictLoader, node: yaml.MappingNode
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may legitimately be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_without_duplicates
)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """The problem and its line and column, without PyYAML's multi-line context."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
