"""Checks of ``policies``: ids, model specs, connector chains and declared spaces.

Everything that can be checked without an env is checked here, when the
config is loaded; what needs the env's spaces is checked when the runner
builds the policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from connectors.errors import ConnectorError
from connectors.registry import check_spec_list, registered_names
from marl_runner.config.errors import (
    ConfigError,
    did_you_mean,
    is_int,
    kind_of,
    quoted,
    reject_unknown_keys,
    shortened,
)
from marl_runner.config.schema import (
    ACTIVATIONS,
    BUILTIN_POLICY_CLASSES,
    MAX_LAYER_WIDTH,
    MAX_MODEL_LAYERS,
    MAX_MODEL_PARAMETERS,
    POLICY_KEYS,
    REQUIRED_HINTS,
    PolicySpec,
    model_keys,
)
from marl_runner.config.spaces import space_from_spec
from marl_runner.config.values import (
    check_bool,
    check_choice,
    check_import_path,
    check_int,
    check_str_keyed,
)

__all__ = [
    "check_chain",
    "check_policies",
    "check_policy_id",
    "connector_key",
    "connector_name",
    "model_weights_floor",
]

_POLICY_ID = re.compile(r"[A-Za-z0-9_.-]+")
#: The built-in models' defaults (``marl_runner.policy.models``), for ``model_weights_floor``.
_DEFAULT_HIDDEN = {"mlp": (64, 64), "lstm": (64,), "cnn": (512,)}


def check_policies(policies: Any) -> dict[str, PolicySpec]:
    """Policy id -> normalised ``PolicySpec``: every key filled in, spaces parsed."""
    if not isinstance(policies, Mapping):
        raise ConfigError("policies", f"got {kind_of(policies)}; {REQUIRED_HINTS['policies']}")
    if not policies:
        raise ConfigError("policies", f"is empty; {REQUIRED_HINTS['policies']}")
    out: dict[str, PolicySpec] = {}
    for pid, spec in policies.items():
        check_policy_id(pid)
        out[pid] = _check_policy(pid, spec)
    return out


def check_policy_id(pid: Any) -> None:
    """Policy ids name batch columns and file-name parts (``--out``), so they must be safe there."""
    if not isinstance(pid, str) or not pid:
        raise ConfigError(f"policies.{pid}", f"policy id {pid!r} must be a non-empty string")
    if _POLICY_ID.fullmatch(pid) and pid not in (".", ".."):
        return
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", pid).strip("._")
    hint = f" (did you mean {safe!r}?)" if safe else ""
    raise ConfigError(
        f"policies.{pid}",
        f"policy id {pid!r} cannot be part of a file name{hint}; expected letters, digits, "
        "'_', '.' and '-' only, and not '.' or '..'",
    )


def _check_policy(pid: str, spec: Any) -> PolicySpec:
    key = f"policies.{pid}"
    if spec is None:  # `knight:` with nothing under it: all defaults
        spec = {}
    if not isinstance(spec, Mapping):
        raise ConfigError(
            key, f"got {kind_of(spec)}, expected a mapping with keys {', '.join(POLICY_KEYS)}"
        )
    reject_unknown_keys(spec, tuple(POLICY_KEYS), prefix=f"{key}.")
    policy_class = spec.get("policy_class")
    if policy_class is not None and policy_class not in BUILTIN_POLICY_CLASSES:
        policy_class = check_import_path(policy_class, f"{key}.policy_class", "a Policy subclass")
    return {
        "model": _check_model(spec.get("model"), f"{key}.model"),
        "policy_class": policy_class,
        "agent_connectors": _check_connectors(
            spec.get("agent_connectors"), f"{key}.agent_connectors", "agent"
        ),
        "action_connectors": _check_connectors(
            spec.get("action_connectors"), f"{key}.action_connectors", "action"
        ),
        "observation_space": check_space(spec.get("observation_space"), f"{key}.observation_space"),
        "action_space": check_space(spec.get("action_space"), f"{key}.action_space"),
        "config": check_str_keyed(spec.get("config"), f"{key}.config", "policy settings"),
    }


def _check_model(model: Any, key: str) -> dict[str, Any]:
    model = check_str_keyed(model, key, "model settings such as {type: mlp, hidden: [64, 64]}")
    if "class" in model:
        if "type" in model:
            raise ConfigError(
                key,
                "gives both 'type' and 'class'; expected one: a built-in type or a custom class",
            )
        check_import_path(model["class"], f"{key}.class", "a torch.nn.Module subclass")
        return model
    model.setdefault("type", "mlp")
    all_keys = model_keys()
    if not isinstance(model["type"], str) or model["type"] not in all_keys:
        raise ConfigError(
            f"{key}.type",
            f"got {model['type']!r}, expected one of {quoted(all_keys)} "
            f"(or a custom model as '{key}.class: pkg.mod:Cls')",
        )
    known = all_keys[model["type"]]
    for name in model:
        if name not in known:
            raise ConfigError(
                f"{key}.{name}",
                f"unknown key for a {model['type']} model{did_you_mean(name, known)}; "
                f"expected some of {quoted(known)}",
            )
    if "hidden" in model:
        hidden = model["hidden"]
        if not isinstance(hidden, list) or not all(is_int(h) and h >= 1 for h in hidden):
            raise ConfigError(
                f"{key}.hidden",
                f"got {hidden!r}, expected a list of layer sizes >= 1, e.g. [64, 64]",
            )
    if "activation" in model:
        check_choice(model["activation"], f"{key}.activation", ACTIVATIONS)
    if "vf_share_layers" in model:
        check_bool(model["vf_share_layers"], f"{key}.vf_share_layers")
    if "lstm_cell_size" in model:
        check_int(model["lstm_cell_size"], f"{key}.lstm_cell_size", minimum=1)
    if "conv" in model:
        _check_conv(model["conv"], f"{key}.conv")
    _check_model_size(model, key)
    return model


def _check_model_size(model: dict[str, Any], key: str) -> None:
    """Refuses a built-in model too big to build, before it is built and its memory taken:
    at most ``MAX_MODEL_LAYERS`` layers, each at most ``MAX_LAYER_WIDTH`` wide, and at most
    ``MAX_MODEL_PARAMETERS`` weights before the env's sizes are added."""
    for name in ("hidden", "lstm_cell_size", "conv"):
        sizes = model.get(name)
        if sizes is None:
            continue
        if name == "lstm_cell_size":
            widths = [sizes]
        else:
            if len(sizes) > MAX_MODEL_LAYERS:
                raise ConfigError(
                    f"{key}.{name}",
                    f"got {len(sizes):,} layers, expected at most {MAX_MODEL_LAYERS} (each "
                    "layer is a module of its own, built twice without vf_share_layers)",
                )
            widths = [size for layer in sizes for size in layer] if name == "conv" else sizes
        if max(widths, default=0) > MAX_LAYER_WIDTH:
            raise ConfigError(
                f"{key}.{name}",
                f"got {shortened(sizes)}, expected sizes of at most {MAX_LAYER_WIDTH:,}",
            )
    count = model_weights_floor(model)
    if count > MAX_MODEL_PARAMETERS:
        given = [n for n in ("hidden", "lstm_cell_size", "conv") if n in model] or ["type"]
        culprit = min(  # the key whose default would leave the fewest weights
            given, key=lambda n: model_weights_floor({k: v for k, v in model.items() if k != n})
        )
        raise ConfigError(
            f"{key}.{culprit}",
            f"these sizes give the {model['type']} model at least {count:,} weights before the "
            f"env's sizes are added, more than the {MAX_MODEL_PARAMETERS:,} a config may ask "
            "for; use smaller layers",
        )


def model_weights_floor(model: Mapping[str, Any]) -> int:
    """The weights of a built-in model with one obs value, one output and (cnn) the least
    image its convolutions take: what its config alone asks for, counted without building it.

    ``marl_runner.policy.models`` builds these layers; a test builds them on torch's meta
    device and compares the counts.
    """
    from marl_runner.policy.models import NATURE_CONV  # imported already by model_keys()

    model_type = model["type"]
    hidden = [int(h) for h in model.get("hidden", _DEFAULT_HIDDEN[model_type])]
    inputs, trunk = 1, 0
    if model_type == "cnn":
        for layer in model.get("conv", NATURE_CONV):
            out_channels, kernel = int(layer[0]), int(layer[1])
            trunk += out_channels * inputs * kernel * kernel + out_channels
            inputs = out_channels  # the least image leaves 1x1 after the last layer
    for width in hidden:
        trunk += inputs * width + width
        inputs = width
    if model_type == "lstm":
        cell = int(model.get("lstm_cell_size", 64))
        return trunk + 4 * (inputs * cell + cell * cell + 2 * cell) + 2 * (cell + 1)
    trunks = 1 if model.get("vf_share_layers", False) else 2
    return trunks * trunk + 2 * (inputs + 1)


def _check_conv(conv: Any, key: str) -> None:
    def is_layer(layer: Any) -> bool:
        if not (isinstance(layer, list) and len(layer) == 3):
            return False
        return all(is_int(v) and v >= 1 for v in layer)

    if not (isinstance(conv, list) and conv and all(map(is_layer, conv))):
        raise ConfigError(
            key,
            f"got {conv!r}, expected a non-empty list of [out_channels, kernel, stride] "
            "integer triples >= 1, e.g. [[32, 8, 4], [64, 4, 2], [64, 3, 1]]",
        )


def _check_connectors(spec: Any, key: str, kind: str) -> list[str | dict[str, Any]] | None:
    """Checks a connector chain as far as it can without an env; None means the default chain.

    Names, parameter names and types, and that every connector is of the
    chain's kind; ``module:Class`` items are left to ``check_imports``.
    """
    if spec is None:
        return None
    if not isinstance(spec, list):
        raise ConfigError(
            key,
            f"got {kind_of(spec)}, expected a list of connector names or {{name: ..., <params>}} mappings",
        )
    items: list[str | dict[str, Any]] = []
    for i, item in enumerate(spec):
        item_key = f"{key}[{i}]"
        if isinstance(item, str) and item.strip():
            name = item.strip()
            items.append(name)
        elif (
            isinstance(item, Mapping) and isinstance(item.get("name"), str) and item["name"].strip()
        ):
            name = item["name"].strip()
            items.append(check_str_keyed(item, item_key, "connector parameters") | {"name": name})
        else:
            raise ConfigError(
                item_key,
                f"got {item!r}, expected a connector name (e.g. 'ClipActionsConnector') "
                "or a mapping with a 'name' key and its parameters (e.g. {name: ClipRewardAgentConnector, limit: 1.0})",
            )
        _check_connector_name(name, item_key, kind)
    check_chain(items, key, kind, import_paths=False)
    return items


def check_chain(items: list[Any], key: str, kind: str, *, import_paths: bool) -> None:
    """The connector registry's checks of a chain, as a ``ConfigError`` at the item's key."""
    try:
        check_spec_list(items, kind, import_paths=import_paths)  # type: ignore[arg-type]
    except ConnectorError as err:
        raise ConfigError(connector_key(key, err), str(err)) from None


def connector_key(chain_key: str, err: ConnectorError) -> str:
    """``policies.p.agent_connectors[0].limt``: where in a chain a ``ConnectorError`` points."""
    if err.index is None:
        return chain_key
    key = f"{chain_key}[{err.index}]"
    return key if err.param is None else f"{key}.{err.param}"


def _check_connector_name(name: str, key: str, kind: str) -> None:
    """Rejects names the connector registry does not know (import paths are checked later)."""
    if ":" in name:
        return
    known = registered_names()
    if name not in known:
        raise ConfigError(
            key,
            f"unknown {kind} connector {name!r}{did_you_mean(name, known)}; expected a registered "
            f"name ({', '.join(known)}), a name given to connectors.register_connector before "
            "the config is loaded, or an import path 'pkg.module:Class'",
        )


def check_space(spec: Any, key: str) -> gym.Space | None:
    """A declared space: None (taken from the env), a gymnasium space, or its YAML form."""
    if spec is None or isinstance(spec, gym.Space):
        return spec
    return space_from_spec(spec, key)


def connector_name(item: str | Mapping[str, Any]) -> str:
    """The name (or import path) of one chain item, a name or a ``{name: ...}`` mapping."""
    return item if isinstance(item, str) else item["name"]
