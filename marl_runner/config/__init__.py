"""Run configs: ``RunnerConfig`` and what it is checked against.

- ``schema``: the choices and the documented keys of ``env`` and a policy;
- ``checks``, ``policy_checks``, ``values``: the checks run on every config;
- ``spaces``: gymnasium spaces as YAML;
- ``yaml_form``: strict YAML loading, plain data out, ``--set`` overrides;
- ``env_callables``: an env class given directly in a Python config;
- ``reference``: docs/CONFIG.md written from all of the above.

Importing this package does not import torch; checking a model spec does
(the model keys live with the models, ``marl_runner.policy.models``).
"""

from __future__ import annotations

from typing import Any

from marl_runner.config.errors import ConfigError
from marl_runner.config.policy_checks import connector_key
from marl_runner.config.runner_config import RunnerConfig
from marl_runner.config.schema import (
    ACTIVATIONS,
    BATCH_MODES,
    BUILTIN_POLICY_CLASSES,
    DEVICES,
    ENV_APIS,
    ENV_KEYS,
    FAKE_OBS_MODES,
    POLICY_KEYS,
    STEP_COUNTS,
    EnvSpec,
    PolicySpec,
)
from marl_runner.config.spaces import space_from_spec, space_to_spec

__all__ = [
    "ACTIVATIONS",
    "BATCH_MODES",
    "BUILTIN_POLICY_CLASSES",
    "DEVICES",
    "ENV_APIS",
    "ENV_KEYS",
    "FAKE_OBS_MODES",
    "POLICY_KEYS",
    "STEP_COUNTS",
    "ConfigError",
    "EnvSpec",
    "PolicySpec",
    "RunnerConfig",
    "connector_key",
    "space_from_spec",
    "space_to_spec",
]


def __getattr__(name: str) -> Any:
    """``MODEL_KEYS`` / ``MODEL_TYPES`` from their home in the models, imported on first use."""
    if name in ("MODEL_KEYS", "MODEL_TYPES"):
        from marl_runner.config.schema import model_keys

        keys = model_keys()
        return keys if name == "MODEL_KEYS" else tuple(keys)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
