"""``check_fields``: every field of a ``RunnerConfig`` checked and normalised, in one pass.

Runs whenever a config is constructed (``from_dict``, ``from_yaml``,
``dataclasses.replace``), so a typo fails before any env is built, naming
the dotted key. Policies are checked in ``policy_checks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marl_runner.config.env_callables import env_name_of
from marl_runner.config.errors import (
    ConfigError,
    did_you_mean,
    kind_of,
    quoted,
    reject_unknown_keys,
    shortened,
)
from marl_runner.config.policy_checks import check_policies
from marl_runner.config.schema import (
    BATCH_MODES,
    ENV_APIS,
    ENV_KEYS,
    FAKE_OBS_MODES,
    MAX_RUNNERS,
    MAX_TORCH_THREADS,
    REQUIRED_HINTS,
    STEP_COUNTS,
    EnvSpec,
    PolicySpec,
)
from marl_runner.config.values import (
    check_bool,
    check_choice,
    check_device,
    check_import_path,
    check_int,
    check_number,
    check_str_keyed,
)
from marl_runner.config.vector_checks import check_vector_options
from marl_runner.envs.vector_backends import vector_backend_names

__all__ = ["check_env", "check_fields"]

#: Integer fields and their minimum; the optional ones may also be null.
_INTS = {
    "num_envs": 1,
    "rollout_fragment_length": 1,
    "max_consecutive_reset_failures": 1,
    "max_consecutive_step_failures": 1,
    "num_runners": 0,
    "max_runner_restarts": 0,
}
_OPTIONAL_INTS = {"seed": 0, "torch_threads": 1, "max_episode_steps": 1}
#: Upper bounds of int fields whose value reaches a C call (torch takes a C int), or Ray's
#: resource arithmetic (a 100-digit num_runners failed there, naming no key).
_MAXIMA = {"torch_threads": MAX_TORCH_THREADS, "num_runners": MAX_RUNNERS}
_BOOLS = (
    "restart_failed_sub_environments",
    "explore",
    "normalize_actions",
    "check_env_outputs",
)
_CHOICES = {
    "batch_mode": BATCH_MODES,
    "count_steps_by": STEP_COUNTS,
    "fake_obs": FAKE_OBS_MODES,
}
#: Number fields: what is expected, in words and as a test; they may be null.
_OPTIONAL_NUMBERS = {
    "ema_coef": ("a number in (0, 1] or null", lambda v: 0 < v <= 1),
}


def check_fields(config: Any) -> None:
    """Checks and normalises every field of ``config`` in place; raises ``ConfigError``."""
    config.env = check_env(config.env)
    for name, minimum in _INTS.items():
        value = check_int(getattr(config, name), name, minimum=minimum, maximum=_MAXIMA.get(name))
        setattr(config, name, value)
    for name, minimum in _OPTIONAL_INTS.items():
        if getattr(config, name) is not None:
            value = check_int(
                getattr(config, name), name, minimum=minimum, maximum=_MAXIMA.get(name)
            )
            setattr(config, name, value)
    for name in _BOOLS:
        setattr(config, name, check_bool(getattr(config, name), name))
    config.vectorize = check_choice(config.vectorize, "vectorize", vector_backend_names())
    for name, choices in _CHOICES.items():
        setattr(config, name, check_choice(getattr(config, name), name, choices))
    for name, (expected, ok) in _OPTIONAL_NUMBERS.items():
        if getattr(config, name) is not None:
            setattr(config, name, check_number(getattr(config, name), name, expected, ok))
    check_vector_options(config)
    config.device = check_device(config.device)
    config.policies = check_policies(config.policies)
    config.policy_mapping_fn = _check_mapping_spec(config.policy_mapping_fn, config.policies)
    if config.callbacks is not None:
        config.callbacks = check_import_path(config.callbacks, "callbacks", "a Callbacks subclass")
    if config.ray_address is not None and (
        not isinstance(config.ray_address, str) or not config.ray_address.strip()
    ):
        raise ConfigError(
            "ray_address",
            f"got {shortened(config.ray_address)}, expected an address such as 'auto' or "
            "'10.0.0.1:6379', or null",
        )


def check_env(env: Any) -> EnvSpec:
    """The ``env`` key: a name (or, in Python, a callable) plus its keyword arguments and api."""
    if isinstance(env, str) or callable(env):  # shorthand: `env: "module:callable"`
        env = {"name": env}
    if not isinstance(env, Mapping):
        raise ConfigError("env", f"got {kind_of(env)}; {REQUIRED_HINTS['env']}")
    reject_unknown_keys(env, tuple(ENV_KEYS), prefix="env.")
    name = env.get("name")
    if name is None:
        raise ConfigError(
            "env.name",
            "missing; expected 'module:callable' (e.g. "
            "'pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env') or a registered "
            "env name",
        )
    if callable(name):
        name = env_name_of(name)
    elif not isinstance(name, str) or not name.strip():
        raise ConfigError(
            "env.name",
            f"got {shortened(name)}, expected a non-empty 'module:callable' or registered name (or, in a "
            "Python config passed to RunnerConfig.from_dict or EnvRunner, the env class or "
            "function itself; YAML can only name it)",
        )
    elif ":" in name:
        check_import_path(name, "env.name", "an env constructor")
    spec: EnvSpec = {
        "name": name.strip(),
        "config": check_str_keyed(
            env.get("config"), "env.config", "keyword arguments for the env constructor"
        ),
        "api": check_choice(env.get("api", "auto"), "env.api", ENV_APIS),
    }
    if check_bool(env.get("capture_state", False), "env.capture_state"):
        spec["capture_state"] = True  # left out when false: older configs' env dicts unchanged
    return spec


def _check_mapping_spec(
    spec: Any, policies: Mapping[str, PolicySpec]
) -> str | dict[str, str] | None:
    key = "policy_mapping_fn"
    if spec is None:
        return None
    if isinstance(spec, str):
        return check_import_path(spec, key, "a function (agent_id, episode, **kwargs) -> policy id")
    if isinstance(spec, Mapping):
        if not spec:
            raise ConfigError(key, "is an empty mapping; expected {agent-id glob: policy id, ...}")
        out: dict[str, str] = {}
        for pattern, pid in spec.items():
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(
                    f"{key}.{pattern}",
                    f"pattern {shortened(pattern)} must be a non-empty string glob such as 'archer_*'",
                )
            if not isinstance(pid, str) or pid not in policies:
                raise ConfigError(
                    f"{key}.{pattern}",
                    f"maps to unknown policy id {shortened(pid)}; expected one of "
                    f"{quoted(policies)}{did_you_mean(pid, policies)}",
                )
            out[pattern] = pid
        return out
    hint = " (pass callables as EnvRunner(policy_mapping_fn=...))" if callable(spec) else ""
    raise ConfigError(
        key,
        f"got {kind_of(spec)}{hint}; expected an import path 'module:function', "
        "a mapping of agent-id glob -> policy id, or null when there is one policy",
    )
