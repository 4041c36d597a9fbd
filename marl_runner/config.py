"""``RunnerConfig``: the whole run described as plain, checkable data.

A config is loaded from YAML (or a dict), checked completely at load time and
normalised (defaults filled in, spaces parsed), so that a typo fails before any
env is built, with a message that names the dotted key, the bad value and what
was expected. ``to_dict()`` gives back plain YAML-safe data, so a run can be
saved next to its output and loaded again unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import gymnasium as gym
import numpy as np
import yaml

from connectors.errors import ConnectorError
from connectors.registry import check_spec_list, registered_names
from marl_runner.envs.vectorize import VECTORIZE_MODES
from marl_runner.imports import ImportPathError, import_object, split_import_path

__all__ = [
    "ConfigError",
    "EnvSpec",
    "PolicySpec",
    "RunnerConfig",
    "space_from_spec",
    "space_to_spec",
]

ENV_APIS = ("auto", "parallel", "aec", "multi_agent")
BATCH_MODES = ("truncate_episodes", "complete_episodes")
STEP_COUNTS = ("env_steps", "agent_steps")
FAKE_OBS_MODES = ("zeros", "sample", "last")
DEVICES = ("cpu", "cuda", "auto")

#: The keys of ``env``, with their reference text.
ENV_KEYS = {
    "name": "'module:callable' returning a PettingZoo env or a MultiAgentEnv, or a name "
    "given to marl_runner.envs.register_env. Required.",
    "config": "Keyword arguments for that callable. Default: {}.",
    "api": "auto (detected), parallel, aec or multi_agent (a marl_runner MultiAgentEnv). "
    "Default: auto.",
}
#: The keys of one policy under ``policies``, with their reference text.
POLICY_KEYS = {
    "model": "The torch model: {type: mlp|lstm, ...} (keys below) or {class: "
    "'pkg.mod:Cls', ...} whose other keys go to Cls(obs_dim, num_outputs, **kwargs). "
    "Default: {type: mlp}.",
    "policy_class": "TorchPolicy, RandomPolicy or 'pkg.mod:Cls' naming a Policy subclass. "
    "Default: TorchPolicy.",
    "agent_connectors": "The agent connector chain: a list of names or {name: ..., <param>: "
    "...} mappings (see docs/CONNECTORS.md). Null: the default chain; []: none.",
    "action_connectors": "The action connector chain, likewise. Null: the default chain; "
    "[]: none.",
    "observation_space": "The env-side observation space, e.g. {type: Box, low: -1.0, high: "
    "1.0, shape: [3]}; must fit the agents mapped to the policy. Null: taken from them.",
    "action_space": "The env-side action space, e.g. {type: Discrete, n: 6}; must fit the "
    "agents mapped to the policy. Null: taken from them.",
    "config": "Policy settings passed to the policy class (gamma, lambda, "
    "view_requirements, ...). Default: {}.",
}
#: Keys of the built-in model types (``model: {type: ...}``), with their reference text.
MODEL_KEYS = {
    "mlp": {
        "type": "mlp: separate policy and value MLPs over the flat observation.",
        "hidden": "Layer sizes. Default: [64, 64].",
        "activation": "tanh or relu. Default: tanh.",
        "vf_share_layers": "One trunk for policy and value. Default: false.",
    },
    "lstm": {
        "type": "lstm: an MLP encoder, one LSTM step per row, policy and value heads.",
        "hidden": "Encoder layer sizes. Default: [64].",
        "activation": "tanh or relu. Default: tanh.",
        "lstm_cell_size": "LSTM state size. Default: 64.",
    },
    "cnn": {
        "type": "cnn: convolutions over image observations (height, width, channels), "
        "channels last; uint8 pixels are scaled to [0, 1] inside the model.",
        "conv": "Conv layers as [out_channels, kernel, stride], no padding. "
        "Default: [[32, 8, 4], [64, 4, 2], [64, 3, 1]] (Nature CNN, for 84x84).",
        "hidden": "Dense layer sizes after the convolutions. Default: [512].",
        "activation": "tanh or relu. Default: relu.",
        "vf_share_layers": "One conv and dense trunk for policy and value (half the compute; "
        "with large unclipped rewards the value loss can swamp the policy). Default: false.",
    },
}
MODEL_TYPES = tuple(MODEL_KEYS)
ACTIVATIONS = ("tanh", "relu")

_ENV_KEYS = tuple(ENV_KEYS)
_POLICY_KEYS = tuple(POLICY_KEYS)
_SPACE_TYPES = ("Discrete", "Box", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")
_CUDA_DEVICE = re.compile(r"cuda:\d+")
_POLICY_ID = re.compile(r"[A-Za-z0-9_.-]+")


class ConfigError(ValueError):
    """A config value that is missing, unknown or malformed.

    ``key`` is the dotted path of the offending entry (``policies.archer.model.type``),
    or None when the problem is the input as a whole; ``source`` names the
    file it came from, when there is one.
    """

    def __init__(self, key: str | None, problem: str, *, source: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.source = source
        text = f"{key}: {problem}" if key else problem
        super().__init__(f"{source}: {text}" if source else text)


class EnvSpec(TypedDict):
    """How to build one sub-environment; the argument of ``marl_runner.envs.make_env``."""

    name: str  # "module:callable" or a name given to register_env
    config: dict[str, Any]  # keyword arguments for the callable
    api: str  # one of ENV_APIS


class PolicySpec(TypedDict):
    """How to build one policy. None for a connector chain means the default chain."""

    model: dict[str, Any]  # {"type": "mlp"|"lstm", ...} or {"class": "pkg.mod:Cls", ...}
    policy_class: str | None
    agent_connectors: list[str | dict[str, Any]] | None
    action_connectors: list[str | dict[str, Any]] | None
    observation_space: gym.Space | None  # None: taken from the env agents mapped to it
    action_space: gym.Space | None
    config: dict[str, Any]


def _key(default: Any, doc: str) -> Any:
    """A config key with its default and reference text (``docs/CONFIG.md`` is made from it)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def _required(doc: str) -> Any:
    """A config key without a default."""
    return dataclasses.field(metadata={"doc": doc})


@dataclasses.dataclass(kw_only=True)
class RunnerConfig:
    """Everything an ``EnvRunner`` needs; see docs/CONFIG.md for the YAML form.

    Constructing one (directly, via ``from_dict``/``from_yaml`` or
    ``dataclasses.replace``) validates and normalises every field, raising
    ``ConfigError`` on the first problem.
    """

    env: EnvSpec = _required(
        "The env: `name` (a 'module:callable' or a registered name), `config` "
        "(keyword arguments for it) and `api` (auto, parallel, aec or multi_agent). "
        "A string is short for `{name: ...}`. Required.",
    )
    num_envs: int = _key(1, "Sub-envs stepped by one runner; one inference batch spans all of them.")
    vectorize: str = _key(
        "sync",
        "How sub-envs are stepped: sync (in this process), subprocess (worker "
        "processes), ray (one Ray actor each) or external (driven by an "
        "ExternalMultiAgentEnv / policy clients).",
    )
    num_workers: int | None = _key(
        None, "subprocess: worker processes; null means min(num_envs, CPU cores)."
    )
    async_poll: bool = _key(
        False,
        "subprocess: poll returns the sub-envs that are ready instead of all of them, so "
        "workers step while inference runs; faster, but which rows share a batch depends "
        "on timing.",
    )
    pin_workers: bool = _key(
        True,
        "subprocess: pin each worker to its own core when workers plus this process fill "
        "the machine (Linux); keeps the scheduler from stacking woken workers on one core.",
    )
    rollout_fragment_length: int = _key(
        200,
        "Steps per sub-env in one batch (truncate_episodes), counted as count_steps_by says.",
    )
    batch_mode: str = _key(
        "truncate_episodes",
        "truncate_episodes: batches of exactly rollout_fragment_length steps per sub-env, "
        "episodes cut where needed; complete_episodes: batches of whole episodes only.",
    )
    count_steps_by: str = _key(
        "env_steps",
        "What rollout_fragment_length counts: env_steps (rounds of a sub-env) or "
        "agent_steps (transitions of single agents).",
    )
    restart_failed_sub_environments: bool = _key(
        False,
        "Recreate a crashed sub-env and go on (its episode is dropped as faulty); false "
        "raises the sub-env's error from sample()/step().",
    )
    remote_env_batch_wait_ms: float = _key(
        0,
        "ray: how long poll waits for more sub-envs after the first answered, so one "
        "forward pass batches more of them.",
    )
    fake_obs: str = _key(
        "zeros",
        "The final obs of an agent the env left without one when the episode ended: "
        "zeros, sample (from its space) or last (its last obs repeated).",
    )
    seed: int | None = _key(
        0, "Seeds sub-envs (seed + index) and policies (per policy id); null: unseeded."
    )
    device: str = _key("cpu", "Torch device for inference: cpu, cuda, cuda:N or auto.")
    explore: bool = _key(True, "Sample actions (true) or take the most likely one (false).")
    normalize_actions: bool = _key(
        False,
        "The default action chain unsquashes Box actions from [-1, 1] (the policy then "
        "acts in Box(-1, 1) of the env's shape) instead of clipping them to the bounds.",
    )
    policies: dict[str, PolicySpec] = _required(
        "Policy id -> policy spec (keys below). Ids name batch columns and files, so they "
        "use letters, digits, '_', '.' and '-' only. Spaces not given are taken from the env "
        "agents mapped to the policy. Required, at least one.",
    )
    policy_mapping_fn: str | dict[str, str] | None = _key(
        None,
        "Agent -> policy id: an import path 'module:function' of fn(agent_id, episode, "
        "**kwargs), a mapping {agent-id glob: policy id} (first match wins), or null when "
        "there is one policy. Callables go to EnvRunner(policy_mapping_fn=...).",
    )
    callbacks: str | None = _key(
        None, "Import path 'module:Class' of a marl_runner.Callbacks subclass."
    )
    ema_coef: float | None = _key(
        None,
        "Perf stats as an exponential moving average with this coefficient in (0, 1]; "
        "null: the mean since the last get_metrics().",
    )
    torch_threads: int | None = _key(
        1,
        "Torch intra-op threads for inference: small per-round batches run fastest on one "
        "thread; null leaves torch's setting alone.",
    )
    sub_env_step_timeout_s: float | None = _key(
        60.0,
        "subprocess/ray: a step or reset slower than this is a fault; null waits forever.",
    )
    max_consecutive_reset_failures: int = _key(
        5, "A sub-env whose resets fail this many times in a row raises, naming the last error."
    )
    max_consecutive_step_failures: int = _key(
        5,
        "A sub-env whose episodes fail this many times in a row (restarts on) raises likewise.",
    )
    check_env_outputs: bool = _key(
        False, "Check every obs against the agent's space and every reward for being finite."
    )
    max_episode_steps: int | None = _key(
        None, "Warn once when an episode has not ended after this many env steps; null: never."
    )
    remote_env_num_cpus: float = _key(0, "ray: CPUs reserved for each sub-env actor.")
    num_runners: int = _key(
        0, "marl_runner.distributed: remote runners in a group; 0 samples locally only."
    )
    max_runner_restarts: int = _key(
        3, "marl_runner.distributed: restarts of a dead runner before it is dropped."
    )
    ray_address: str | None = _key(
        None,
        "marl_runner.distributed: the Ray cluster to join; null joins the running one or "
        "starts a local one.",
    )
    external_episode_timeout_s: float | None = _key(
        60.0, "external: an episode quiet this long ends as faulty; null: never."
    )

    def __post_init__(self) -> None:
        self.env = _check_env(self.env)
        self.num_envs = _check_int(self.num_envs, "num_envs", minimum=1)
        self.vectorize = _check_choice(self.vectorize, "vectorize", VECTORIZE_MODES)
        if self.num_workers is not None:
            self.num_workers = _check_int(self.num_workers, "num_workers", minimum=1)
            if self.vectorize == "subprocess" and self.num_workers > self.num_envs:
                raise ConfigError(
                    "num_workers",
                    f"got {self.num_workers}, expected at most num_envs ({self.num_envs}): "
                    "each worker process steps at least one sub-env",
                )
        self.rollout_fragment_length = _check_int(
            self.rollout_fragment_length, "rollout_fragment_length", minimum=1
        )
        self.batch_mode = _check_choice(self.batch_mode, "batch_mode", BATCH_MODES)
        self.count_steps_by = _check_choice(self.count_steps_by, "count_steps_by", STEP_COUNTS)
        self.restart_failed_sub_environments = _check_bool(
            self.restart_failed_sub_environments, "restart_failed_sub_environments"
        )
        self.remote_env_batch_wait_ms = _check_number(
            self.remote_env_batch_wait_ms,
            "remote_env_batch_wait_ms",
            "a number >= 0",
            lambda v: v >= 0,
        )
        self.fake_obs = _check_choice(self.fake_obs, "fake_obs", FAKE_OBS_MODES)
        if self.seed is not None:
            self.seed = _check_int(self.seed, "seed", minimum=None)
        self.device = _check_device(self.device)
        self.explore = _check_bool(self.explore, "explore")
        self.normalize_actions = _check_bool(self.normalize_actions, "normalize_actions")
        self.async_poll = _check_bool(self.async_poll, "async_poll")
        self.pin_workers = _check_bool(self.pin_workers, "pin_workers")
        self.policies = _check_policies(self.policies)
        self.policy_mapping_fn = _check_mapping_spec(self.policy_mapping_fn, self.policies)
        if self.callbacks is not None:
            self.callbacks = _check_import_path(self.callbacks, "callbacks", "a Callbacks subclass")
        if self.torch_threads is not None:
            self.torch_threads = _check_int(self.torch_threads, "torch_threads", minimum=1)
        if self.ema_coef is not None:
            self.ema_coef = _check_number(
                self.ema_coef, "ema_coef", "a number in (0, 1] or null", lambda v: 0 < v <= 1
            )
        for name in ("sub_env_step_timeout_s", "external_episode_timeout_s"):
            if getattr(self, name) is not None:
                setattr(self, name, _check_number(
                    getattr(self, name), name, "a number of seconds > 0, or null", lambda v: v > 0
                ))
        self.max_consecutive_reset_failures = _check_int(
            self.max_consecutive_reset_failures, "max_consecutive_reset_failures", minimum=1
        )
        self.max_consecutive_step_failures = _check_int(
            self.max_consecutive_step_failures, "max_consecutive_step_failures", minimum=1
        )
        self.check_env_outputs = _check_bool(self.check_env_outputs, "check_env_outputs")
        if self.max_episode_steps is not None:
            self.max_episode_steps = _check_int(self.max_episode_steps, "max_episode_steps", minimum=1)
        self.remote_env_num_cpus = _check_number(
            self.remote_env_num_cpus, "remote_env_num_cpus", "a number >= 0", lambda v: v >= 0
        )
        self.num_runners = _check_int(self.num_runners, "num_runners", minimum=0)
        self.max_runner_restarts = _check_int(self.max_runner_restarts, "max_runner_restarts", minimum=0)
        if self.ray_address is not None and (
            not isinstance(self.ray_address, str) or not self.ray_address.strip()
        ):
            raise ConfigError(
                "ray_address", f"got {self.ray_address!r}, expected an address such as "
                "'auto' or '10.0.0.1:6379', or null"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunnerConfig:
        """Builds a config from plain data (e.g. parsed YAML), rejecting unknown keys."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                None, f"a config must be a mapping of keys to values, got {_kind(data)}"
            )
        _reject_unknown_keys(data, _FIELD_NAMES, prefix="")
        for required in ("env", "policies"):
            if required not in data:
                raise ConfigError(required, f"missing; {_REQUIRED_HINTS[required]}")
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunnerConfig:
        """Loads a YAML file; any problem is reported with the file's name (and line when parsing)."""
        path = Path(path)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                None, f"cannot read the config file: {exc.strerror or exc}", source=source
            ) from None
        try:
            data = yaml.load(text, Loader=_StrictLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(None, _describe_yaml_error(exc), source=source) from None
        if data is None:
            raise ConfigError(
                None,
                "the file is empty; expected a mapping with at least 'env' and 'policies'",
                source=source,
            )
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(exc.key, exc.problem, source=source) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-safe data (spaces as ``{type: ...}`` dicts) that ``from_dict`` accepts."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "policies":
                value = {pid: _policy_to_dict(spec) for pid, spec in value.items()}
            out[field.name] = _plain(value)
        return out

    def with_overrides(self, overrides: Iterable[str]) -> RunnerConfig:
        """Returns a copy with ``"dotted.key=value"`` overrides applied (the CLI's ``--set``).

        Values are parsed as YAML (``8``, ``true``, ``[32, 32]``, ``null``);
        missing intermediate mappings are created, so
        ``env.config.max_cycles=50`` works even when ``env.config`` was empty.
        The result is validated like any other config.
        """
        data = self.to_dict()
        for override in overrides:
            key, value = _parse_override(override)
            _set_dotted(data, key, value)
        return RunnerConfig.from_dict(data)

    def check_imports(self) -> None:
        """Imports every import path in the config so that a typo fails now, naming its key.

        Loading a config only checks the shape of import paths, because the
        code they name may not be importable where the config is edited; call
        this where the run will happen.
        """
        paths: list[tuple[str, str]] = []
        if ":" in self.env["name"]:
            paths.append(("env.name", self.env["name"]))
        if isinstance(self.policy_mapping_fn, str):
            paths.append(("policy_mapping_fn", self.policy_mapping_fn))
        if self.callbacks is not None:
            paths.append(("callbacks", self.callbacks))
        for pid, spec in self.policies.items():
            if spec["policy_class"] not in (None, *BUILTIN_POLICY_CLASSES):
                paths.append((f"policies.{pid}.policy_class", spec["policy_class"]))
            if "class" in spec["model"]:
                paths.append((f"policies.{pid}.model.class", spec["model"]["class"]))
        for pid, spec in self.policies.items():
            for kind in ("agent", "action"):
                chain = spec[f"{kind}_connectors"]
                if chain and any(":" in _connector_name(item) for item in chain):
                    _check_chain(chain, f"policies.{pid}.{kind}_connectors", kind, import_paths=True)
        for key, path in paths:
            try:
                obj = import_object(path)
            except ImportPathError as exc:
                raise ConfigError(key, str(exc)) from None
            if not callable(obj):
                raise ConfigError(
                    key, f"{path!r} names a {type(obj).__name__}, expected something callable"
                )


# Policy classes named without an import path (see marl_runner.policy.build_policy).
BUILTIN_POLICY_CLASSES = ("TorchPolicy", "RandomPolicy")
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RunnerConfig))
_REQUIRED_HINTS = {
    "env": "expected a mapping with 'name' (e.g. 'pettingzoo.classic.tictactoe_v3:env'), "
    "and optionally 'config' and 'api'",
    "policies": "expected a mapping of policy id -> policy spec with at least one policy",
}


# ----------------------------------------------------------------------------
# Field checks. Each returns the normalised value or raises ConfigError.


def _check_env(env: Any) -> EnvSpec:
    if isinstance(env, str):  # shorthand: `env: "module:callable"`
        env = {"name": env}
    if not isinstance(env, Mapping):
        raise ConfigError("env", f"got {_kind(env)}; {_REQUIRED_HINTS['env']}")
    _reject_unknown_keys(env, _ENV_KEYS, prefix="env.")
    name = env.get("name")
    if name is None:
        raise ConfigError(
            "env.name",
            "missing; expected 'module:callable' (e.g. "
            "'pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env') or a registered env name",
        )
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            "env.name", f"got {name!r}, expected a non-empty 'module:callable' or registered name"
        )
    if ":" in name:
        _check_import_path(name, "env.name", "an env constructor")
    return {
        "name": name.strip(),
        "config": _check_str_keyed(
            env.get("config"), "env.config", "keyword arguments for the env constructor"
        ),
        "api": _check_choice(env.get("api", "auto"), "env.api", ENV_APIS),
    }


def _check_policies(policies: Any) -> dict[str, PolicySpec]:
    if not isinstance(policies, Mapping):
        raise ConfigError("policies", f"got {_kind(policies)}; {_REQUIRED_HINTS['policies']}")
    if not policies:
        raise ConfigError("policies", f"is empty; {_REQUIRED_HINTS['policies']}")
    out: dict[str, PolicySpec] = {}
    for pid, spec in policies.items():
        _check_policy_id(pid)
        out[pid] = _check_policy(pid, spec)
    return out


def _check_policy_id(pid: Any) -> None:
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
            key, f"got {_kind(spec)}, expected a mapping with keys {', '.join(_POLICY_KEYS)}"
        )
    _reject_unknown_keys(spec, _POLICY_KEYS, prefix=f"{key}.")
    policy_class = spec.get("policy_class")
    if policy_class is not None and policy_class not in BUILTIN_POLICY_CLASSES:
        policy_class = _check_import_path(policy_class, f"{key}.policy_class", "a Policy subclass")
    return {
        "model": _check_model(spec.get("model"), f"{key}.model"),
        "policy_class": policy_class,
        "agent_connectors": _check_connectors(
            spec.get("agent_connectors"), f"{key}.agent_connectors", "agent"
        ),
        "action_connectors": _check_connectors(
            spec.get("action_connectors"), f"{key}.action_connectors", "action"
        ),
        "observation_space": _check_space(
            spec.get("observation_space"), f"{key}.observation_space"
        ),
        "action_space": _check_space(spec.get("action_space"), f"{key}.action_space"),
        "config": _check_str_keyed(spec.get("config"), f"{key}.config", "policy settings"),
    }


def _check_model(model: Any, key: str) -> dict[str, Any]:
    model = _check_str_keyed(model, key, "model settings such as {type: mlp, hidden: [64, 64]}")
    if "class" in model:
        if "type" in model:
            raise ConfigError(
                key,
                "gives both 'type' and 'class'; expected one: a built-in type or a custom class",
            )
        _check_import_path(model["class"], f"{key}.class", "a torch.nn.Module subclass")
        return model
    model.setdefault("type", "mlp")
    if model["type"] not in MODEL_TYPES:
        raise ConfigError(
            f"{key}.type",
            f"got {model['type']!r}, expected one of {_quoted(MODEL_TYPES)} "
            f"(or a custom model as '{key}.class: pkg.mod:Cls')",
        )
    known = MODEL_KEYS[model["type"]]
    for name in model:
        if name not in known:
            raise ConfigError(
                f"{key}.{name}",
                f"unknown key for a {model['type']} model{_suggest(name, known)}; "
                f"expected some of {_quoted(known)}",
            )
    if "hidden" in model:
        hidden = model["hidden"]
        if not isinstance(hidden, list) or not all(_is_int(h) and h >= 1 for h in hidden):
            raise ConfigError(
                f"{key}.hidden",
                f"got {hidden!r}, expected a list of layer sizes >= 1, e.g. [64, 64]",
            )
    if "activation" in model:
        _check_choice(model["activation"], f"{key}.activation", ACTIVATIONS)
    if "vf_share_layers" in model:
        _check_bool(model["vf_share_layers"], f"{key}.vf_share_layers")
    if "lstm_cell_size" in model:
        _check_int(model["lstm_cell_size"], f"{key}.lstm_cell_size", minimum=1)
    if "conv" in model:
        _check_conv(model["conv"], f"{key}.conv")
    return model


def _check_conv(conv: Any, key: str) -> None:
    def is_layer(layer: Any) -> bool:
        if not (isinstance(layer, list) and len(layer) == 3):
            return False
        return all(_is_int(v) and v >= 1 for v in layer)

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
            f"got {_kind(spec)}, expected a list of connector names or {{name: ..., <params>}} mappings",
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
            items.append(_check_str_keyed(item, item_key, "connector parameters") | {"name": name})
        else:
            raise ConfigError(
                item_key,
                f"got {item!r}, expected a connector name (e.g. 'ClipActionsConnector') "
                "or a mapping with a 'name' key and its parameters (e.g. {name: ClipRewardAgentConnector, limit: 1.0})",
            )
        _check_connector_name(name, item_key, kind)
    _check_chain(items, key, kind, import_paths=False)
    return items


def _check_chain(items: list[Any], key: str, kind: str, *, import_paths: bool) -> None:
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
            f"unknown {kind} connector {name!r}{_suggest(name, known)}; expected a registered "
            f"name ({', '.join(known)}), a name given to connectors.register_connector before "
            "the config is loaded, or an import path 'pkg.module:Class'",
        )


def _connector_name(item: str | Mapping[str, Any]) -> str:
    return item if isinstance(item, str) else item["name"]


def _check_mapping_spec(
    spec: Any, policies: Mapping[str, PolicySpec]
) -> str | dict[str, str] | None:
    key = "policy_mapping_fn"
    if spec is None:
        return None
    if isinstance(spec, str):
        return _check_import_path(
            spec, key, "a function (agent_id, episode, **kwargs) -> policy id"
        )
    if isinstance(spec, Mapping):
        if not spec:
            raise ConfigError(key, "is an empty mapping; expected {agent-id glob: policy id, ...}")
        out: dict[str, str] = {}
        for pattern, pid in spec.items():
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(
                    f"{key}.{pattern}",
                    f"pattern {pattern!r} must be a non-empty string glob such as 'archer_*'",
                )
            if pid not in policies:
                raise ConfigError(
                    f"{key}.{pattern}",
                    f"maps to unknown policy id {pid!r}; expected one of {_quoted(policies)}{_suggest(pid, policies)}",
                )
            out[pattern] = pid
        return out
    hint = " (pass callables as EnvRunner(policy_mapping_fn=...))" if callable(spec) else ""
    raise ConfigError(
        key,
        f"got {_kind(spec)}{hint}; expected an import path 'module:function', "
        "a mapping of agent-id glob -> policy id, or null when there is one policy",
    )


def _check_space(spec: Any, key: str) -> gym.Space | None:
    if spec is None or isinstance(spec, gym.Space):
        return spec
    return space_from_spec(spec, key)


def _check_device(device: Any) -> str:
    if isinstance(device, str) and (device in DEVICES or _CUDA_DEVICE.fullmatch(device)):
        return device
    raise ConfigError("device", f"got {device!r}, expected one of {_quoted(DEVICES)} or 'cuda:N'")


def _check_import_path(path: Any, key: str, what: str) -> str:
    try:
        split_import_path(path)
    except ImportPathError:
        raise ConfigError(
            key, f"got {path!r}, expected an import path 'pkg.module:name' naming {what}"
        ) from None
    return path.strip()


def _check_int(value: Any, key: str, *, minimum: int | None) -> int:
    if not _is_int(value) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ConfigError(key, f"got {value!r}, expected an integer{bound}")
    return int(value)


def _check_number(value: Any, key: str, expected: str, ok: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(key, f"got {value!r}, expected {expected}")
    return value


def _check_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"got {value!r}, expected true or false")
    return value


def _check_choice(value: Any, key: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(
            key, f"got {value!r}, expected one of {_quoted(choices)}{_suggest(value, choices)}"
        )
    return value


def _check_str_keyed(value: Any, key: str, what: str) -> dict[str, Any]:
    """A mapping with string keys (None -> {}), copied so the caller's data is never aliased."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"got {_kind(value)}, expected a mapping of {what}")
    for k in value:
        if not isinstance(k, str):
            raise ConfigError(f"{key}.{k}", f"key {k!r} must be a string")
    return copy.deepcopy(dict(value))


def _reject_unknown_keys(data: Mapping[Any, Any], known: Sequence[str], *, prefix: str) -> None:
    for k in data:
        if k not in known:
            hint = _suggest(k, known) or f"; expected one of {_quoted(known)}"
            raise ConfigError(f"{prefix}{k}", f"unknown key{hint}")


# ----------------------------------------------------------------------------
# Spaces as YAML: {type: Box, low: -1.0, high: 1.0, shape: [3], dtype: float32}


def space_from_spec(spec: Any, key: str = "space") -> gym.Space:
    """Builds a gymnasium space from its YAML form (see ``space_to_spec``)."""
    if not isinstance(spec, Mapping) or spec.get("type") not in _SPACE_TYPES:
        raise ConfigError(
            key,
            f"got {spec!r}, expected a space such as {{type: Discrete, n: 6}} or "
            f"{{type: Box, low: -1.0, high: 1.0, shape: [3]}}; types: {_quoted(_SPACE_TYPES)}",
        )
    kind = spec["type"]
    allowed = {
        "Discrete": ("n", "start"),
        "Box": ("low", "high", "shape", "dtype"),
        "MultiDiscrete": ("nvec", "dtype"),
        "MultiBinary": ("n",),
        "Dict": ("spaces",),
        "Tuple": ("spaces",),
    }[kind]
    _reject_unknown_keys({k: v for k, v in spec.items() if k != "type"}, allowed, prefix=f"{key}.")
    try:
        if kind == "Discrete":
            return gym.spaces.Discrete(spec["n"], start=spec.get("start", 0))
        if kind == "Box":
            dtype = np.dtype(spec.get("dtype", "float32"))
            shape = tuple(spec["shape"]) if spec.get("shape") is not None else None
            return gym.spaces.Box(
                _bound(spec["low"], dtype), _bound(spec["high"], dtype), shape=shape, dtype=dtype
            )
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(spec["nvec"], dtype=spec.get("dtype", "int64"))
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(spec["n"])
        if kind == "Dict":
            if not isinstance(spec["spaces"], Mapping):
                raise TypeError("'spaces' must be a mapping of name -> space")
            return gym.spaces.Dict(
                {k: space_from_spec(v, f"{key}.spaces.{k}") for k, v in spec["spaces"].items()}
            )
        if not isinstance(spec["spaces"], list):
            raise TypeError("'spaces' must be a list of spaces")
        return gym.spaces.Tuple(
            [space_from_spec(v, f"{key}.spaces[{i}]") for i, v in enumerate(spec["spaces"])]
        )
    except ConfigError:
        raise
    except KeyError as exc:
        raise ConfigError(
            key, f"{kind} space is missing {exc.args[0]!r} (keys: {_quoted(allowed)})"
        ) from None
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(key, f"invalid {kind} space {dict(spec)!r}: {exc}") from None


def space_to_spec(space: gym.Space) -> dict[str, Any]:
    """The YAML-safe form of a space; ``space_from_spec`` rebuilds an equal space."""
    if isinstance(space, gym.spaces.Discrete):
        spec: dict[str, Any] = {"type": "Discrete", "n": int(space.n)}
        if int(space.start) != 0:
            spec["start"] = int(space.start)
        return spec
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": _uniform_or_list(space.low),
            "high": _uniform_or_list(space.high),
            "shape": list(space.shape),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "dtype": space.dtype.name}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": _plain(space.n)}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_spec(v) for k, v in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_spec(v) for v in space.spaces]}
    raise ConfigError(
        None,
        f"cannot write a {type(space).__name__} space to a config; supported: {_quoted(_SPACE_TYPES)}",
    )


def _bound(value: Any, dtype: np.dtype) -> Any:
    """A Box bound in the Box's dtype: gymnasium wants scalars as scalars, lists as arrays."""
    return dtype.type(value) if np.ndim(value) == 0 else np.asarray(value, dtype=dtype)


def _uniform_or_list(values: np.ndarray) -> Any:
    """A scalar when every entry is equal (the common case), else the nested list."""
    flat = values.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return flat[0].item()
    return values.tolist()


# ----------------------------------------------------------------------------
# Serialisation, overrides and YAML details.


def _policy_to_dict(spec: PolicySpec) -> dict[str, Any]:
    out = dict(spec)
    for space_key in ("observation_space", "action_space"):
        if out[space_key] is not None:
            out[space_key] = space_to_spec(out[space_key])
    return out


def _plain(value: Any) -> Any:
    """Deep copy into YAML-safe builtins (numpy scalars and tuples included)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
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


def _parse_override(override: str) -> tuple[str, Any]:
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            None, f"override {override!r}: expected 'dotted.key=value', e.g. 'num_envs=8'"
        )
    try:
        return key, yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            key, f"override {override!r}: the value is not valid YAML ({_describe_yaml_error(exc)})"
        ) from None


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                where, f"cannot set {key!r}: {where!r} holds {_kind(child)}, not a mapping"
            )
        node = child
    node[parts[-1]] = value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last) and reads
    ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3`` and would give the string "1e-3")."""


_StrictLoader.yaml_implicit_resolvers = {
    first: list(resolvers) for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _construct_mapping_without_duplicates(
    loader: _StrictLoader, node: yaml.MappingNode
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


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_without_duplicates
)


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _suggest(value: Any, known: Iterable[str]) -> str:
    if not isinstance(value, str):
        return ""
    matches = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
