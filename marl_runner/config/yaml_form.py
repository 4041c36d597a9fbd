"""YAML in and out: the strict loader, plain data for ``to_dict``, and ``--set`` overrides.

Configs are edited by hand, so loading refuses what PyYAML would silently
accept (a duplicate key keeps the last value) and reads ``1e-3`` as the
number it looks like; writing turns numpy values, tuples and spaces into
plain YAML-safe data.

Configs also come from elsewhere, so the loader bounds what a small file can
ask for: at most ``MAX_YAML_DEPTH`` levels of nesting (deeper would recurse
past Python's stack), and at most ``MAX_YAML_NODES`` values and
``MAX_YAML_CHARS`` characters once aliases are expanded (1 KB of ``&a [*b,
*b, ...]`` lines can stand for billions, and every later copy, check or
message would expand them). Aliases that refer to
themselves are refused. Each is a one-line YAML error with its line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

from marl_runner.config.errors import ConfigError, kind_of, shortened
from marl_runner.config.spaces import space_to_spec

__all__ = [
    "MAX_YAML_DEPTH",
    "MAX_YAML_CHARS",
    "MAX_YAML_NODES",
    "StrictLoader",
    "describe_yaml_error",
    "parse_override",
    "plain",
    "set_dotted",
]

#: Levels of nesting a config may have; real ones need about 8.
MAX_YAML_DEPTH = 32
#: Values (scalars, lists, mappings) a config may hold with its aliases expanded.
MAX_YAML_NODES = 100_000
#: Characters of scalars a config may hold with its aliases expanded: a config file's
#: largest size (``MAX_CONFIG_BYTES``). 50,000 aliases of one 1 MB string are few values
#: but 50 GB of text for every later copy, message and written ``config.yaml``.
MAX_YAML_CHARS = 4 << 20


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
        None,
        f"cannot write a {type(value).__name__} ({shortened(value)}) to a config; expected "
        "plain data",
    )


def parse_override(override: str) -> tuple[str, Any]:
    """``"a.b=[1, 2]"`` -> ``("a.b", [1, 2])``: the value is YAML, as a config file would hold."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            None, f"override {shortened(override)}: expected 'dotted.key=value', e.g. 'num_envs=8'"
        )
    try:
        return key, yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            key,
            f"override {shortened(override)}: the value is not valid YAML "
            f"({describe_yaml_error(exc)})",
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
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last), reads
    ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3`` and would give the string "1e-3"),
    and refuses documents past ``MAX_YAML_DEPTH`` levels or ``MAX_YAML_NODES`` values
    with aliases expanded."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Composes a node, refusing to go deeper than ``MAX_YAML_DEPTH`` before recursing."""
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"the document is nested more than {MAX_YAML_DEPTH} levels deep",
                self.peek_event().start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> yaml.Node | None:
        """The document's node graph, checked with its aliases expanded before anything is
        constructed from it."""
        node = super().get_single_node()
        if node is not None:
            _check_expanded(node)
        return node


def _check_expanded(root: yaml.Node) -> None:
    """Counts the values, levels and characters of the document as if every alias were copied out,
    without copying: each node's totals are computed once (an alias shares its anchor's
    node), iteratively (no recursion)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    chars: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            on_path.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in children)
            depth[key] = 1 + max((depth[id(child)] for child in children), default=0)
            chars[key] = (
                len(node.value) if isinstance(node, yaml.ScalarNode)
                else sum(chars[id(child)] for child in children)
            )
            what = (
                f"more than {MAX_YAML_NODES:,} values" if size[key] > MAX_YAML_NODES
                else f"more than {MAX_YAML_DEPTH} levels" if depth[key] > MAX_YAML_DEPTH
                else f"more than {MAX_YAML_CHARS:,} characters" if chars[key] > MAX_YAML_CHARS
                else None
            )
            if what is not None:
                raise yaml.composer.ComposerError(
                    None, None, f"its aliases expand to {what}", node.start_mark
                )
            continue
        if key in size:
            continue
        if key in on_path:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to itself (a recursive structure)", node.start_mark
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


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
        if not isinstance(key_node, yaml.ScalarNode):  # `? [1, 2]`: no config key is one
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found a key that is a list or a mapping; expected a plain value",
                key_node.start_mark,
            )
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {shortened(key)}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_without_duplicates
)


def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int:
    """PyYAML's int, with Python's limit on digits (4300) a YAML error at the value's line
    instead of a bare ``ValueError``; no config key needs a number that long."""
    try:
        return loader.construct_yaml_int(node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"an integer of {len(node.value):,} characters, more than Python reads "
            f"({sys.get_int_max_str_digits()} digits)",
            node.start_mark,
        ) from None


StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """The problem and its line and column, without PyYAML's multi-line context."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
