"""``RunnerConfig``: the whole run described as plain, checkable data.

A config is loaded from YAML (or a dict), checked completely at load time and
normalised (defaults filled in, spaces parsed), so that a typo fails before any
env is built, with a message that names the dotted key, the bad value and what
was expected. ``to_dict()`` gives back plain YAML-safe data, so a run can be
saved next to its output and loaded again unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from connectors.imports import ImportPathError, import_object
from marl_runner.config.checks import check_fields
from marl_runner.config.errors import ConfigError, kind_of, reject_unknown_keys
from marl_runner.config.policy_checks import check_chain, connector_name
from marl_runner.config.schema import (
    BUILTIN_POLICY_CLASSES,
    EXCLUDABLE_COLUMNS,
    MAX_RUNNERS,
    MAX_TORCH_THREADS,
    REQUIRED_HINTS,
    EnvSpec,
    PolicySpec,
)
from marl_runner.config.spaces import space_to_spec
from marl_runner.config.vector_checks import vector_keys_for
from marl_runner.config.yaml_form import (
    StrictLoader,
    describe_yaml_error,
    parse_override,
    plain,
    set_dotted,
)
from marl_runner.envs.vector_backends import vector_keys
from marl_runner.safe_files import FileRefused, read_regular_file

__all__ = ["RunnerConfig"]

#: A config file's largest size: real ones are a few KB (a FIFO or /dev/zero is refused too).
MAX_CONFIG_BYTES = 4 << 20


def _key(default: Any, doc: str) -> Any:
    """A config key with its default and reference text (``docs/CONFIG.md`` is made from it)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def _required(doc: str) -> Any:
    """A config key without a default."""
    return dataclasses.field(metadata={"doc": doc})


@dataclasses.dataclass(kw_only=True, init=False)
class RunnerConfig:
    """Everything an ``EnvRunner`` needs; see docs/CONFIG.md for the YAML form.

    Constructing one (directly, via ``from_dict``/``from_yaml`` or
    ``dataclasses.replace``) validates and normalises every field, raising
    ``ConfigError`` on the first problem. The keys of the ``vectorize``
    backends (registered with them, ``marl_runner.envs.vector_backends``) are
    top-level keys too: held in ``vector_options``, read as attributes.
    """

    env: EnvSpec = _required(
        "The env: `name` (a 'module:callable' or a registered name), `config` "
        "(keyword arguments for it) and `api` (auto, parallel, aec or multi_agent). "
        "A string is short for `{name: ...}`; so, in a Python config, is the env class or "
        "function itself (see env.name below). Required.",
    )
    num_envs: int = _key(
        1, "Sub-envs stepped by one runner; one inference batch spans all of them."
    )
    vectorize: str = _key(
        "sync",
        "How sub-envs are stepped: a vectorize backend (see `vectorize` backends below): "
        "sync, subprocess, ray, external, or one registered with "
        "marl_runner.envs.vector_backends.register_vector_backend. Each backend's own keys "
        "follow this one.",
    )
    vector_options: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata={
            "doc": "The vectorize backends' keys (num_workers, ...) with their values; each is a "
            "top-level key in YAML and an attribute of the config."
        },
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
        "raises the sub-env's error from sample()/step(); a sub-env whose worker process or "
        "Ray actor died is then gone, and each later call raises at once that it is.",
    )
    fake_obs: str = _key(
        "zeros",
        "The final obs of an agent the env left without one when the episode ended: "
        "zeros, sample (from its space) or last (its last obs repeated).",
    )
    exclude_columns: list[str] = _key(
        (),
        "Batch columns left out, for a trainer that does not read them: any of "
        + ", ".join(EXCLUDABLE_COLUMNS)
        + ". [new_obs] halves the bytes per row of image-like obs for on-policy training "
        "(a policy with gae still gets new_obs for its bootstrap value; the batch handed out "
        "has none). Default: every column.",
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
        "Torch intra-op threads and numpy's BLAS threads for inference (CPU inference runs "
        "in either): small per-round batches run fastest on one thread; null leaves both "
        f"settings alone. At most {MAX_TORCH_THREADS}.",
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
        None,
        "Warn once when an episode has not ended after this many env steps; with batch_mode "
        "complete_episodes, drop such an episode instead (faulty, its sub-env reset): whole "
        "episodes only are handed out, and one that never ends would grow without bound. "
        "null: no limit (with complete_episodes, an episode past 100,000 env steps is warned "
        "of once: sample() waits for it).",
    )
    num_runners: int = _key(
        0,
        "marl_runner.distributed: remote runners in a group; 0 samples locally only. At most "
        f"{MAX_RUNNERS:,}.",
    )
    max_runner_restarts: int = _key(
        3, "marl_runner.distributed: restarts of a dead runner before it is dropped."
    )
    ray_address: str | None = _key(
        None,
        "marl_runner.distributed: the Ray cluster to join; null joins the running one or "
        "starts a local one.",
    )

    def __init__(self, **values: Any) -> None:
        """Takes every key by name, a backend's keys (``num_workers=2``) included."""
        keys = vector_keys_for(RunnerConfig)
        reject_unknown_keys(values, (*_FIELD_NAMES, "vector_options", *keys), prefix="")
        options = dict(values.pop("vector_options", None) or {})
        options.update((name, values.pop(name)) for name in list(values) if name in keys)
        for field in dataclasses.fields(self):
            if field.name == "vector_options":
                value: Any = options
            elif field.name in values:
                value = values[field.name]
            elif field.default is not dataclasses.MISSING:
                value = field.default
            else:
                raise ConfigError(field.name, f"missing; {REQUIRED_HINTS[field.name]}")
            object.__setattr__(self, field.name, value)
        check_fields(self)
        self.exclude_columns = _check_exclude_columns(self.exclude_columns)

    def __getattr__(self, name: str) -> Any:
        """A backend's key (``config.num_workers``): its value, else its registered default."""
        options = self.__dict__.get("vector_options")
        if options is not None:
            if name in options:
                return options[name]
            key = vector_keys().get(name)
            if key is not None:
                return key.default
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting a backend's key updates ``vector_options``, so ``to_dict`` sees it."""
        if name not in _FIELD_NAMES and name in vector_keys():
            self.vector_options[name] = value
        else:
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunnerConfig:
        """Builds a config from plain data (e.g. parsed YAML), rejecting unknown keys."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                None, f"a config must be a mapping of keys to values, got {kind_of(data)}"
            )
        reject_unknown_keys(data, (*_FIELD_NAMES, *vector_keys_for(cls)), prefix="")
        for required in ("env", "policies"):
            if required not in data:
                raise ConfigError(required, f"missing; {REQUIRED_HINTS[required]}")
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunnerConfig:
        """Loads a YAML file; any problem is reported with the file's name (and line when parsing)."""
        path = Path(path)
        source = str(path)
        try:
            text = read_regular_file(path, max_bytes=MAX_CONFIG_BYTES).decode("utf-8")
        except OSError as exc:
            raise ConfigError(
                None, f"cannot read the config file: {exc.strerror or exc}", source=source
            ) from None
        except FileRefused as exc:
            raise ConfigError(None, f"the config file {exc}", source=source) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                None, f"the config file is not UTF-8 text: {exc}", source=source
            ) from None
        try:
            data = yaml.load(text, Loader=StrictLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(None, describe_yaml_error(exc), source=source) from None
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
            if field.name == "vector_options":
                out.update((name, plain(v)) for name, v in value.items())
                continue
            if field.name == "policies":
                value = {pid: _policy_to_dict(spec) for pid, spec in value.items()}
            out[field.name] = plain(value)
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
            key, value = parse_override(override)
            set_dotted(data, key, value)
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
                if chain and any(":" in connector_name(item) for item in chain):
                    key = f"policies.{pid}.{kind}_connectors"
                    check_chain(chain, key, kind, import_paths=True)
        for key, path in paths:
            try:
                obj = import_object(path)
            except ImportPathError as exc:
                raise ConfigError(key, str(exc)) from None
            if not callable(obj):
                raise ConfigError(
                    key, f"{path!r} names a {type(obj).__name__}, expected something callable"
                )


#: The top-level keys that are fields; the backends' keys live in ``vector_options``.
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RunnerConfig) if f.name != "vector_options")


def _check_exclude_columns(value: Any) -> list[str]:
    """``exclude_columns``: a list of distinct excludable column names (null: none)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            "exclude_columns",
            f"got {kind_of(value)}, expected a list of column names such as [new_obs]",
        )
    names: list[str] = []
    for name in value:
        if name not in EXCLUDABLE_COLUMNS:
            raise ConfigError(
                "exclude_columns",
                f"got {name!r}, expected column names among {', '.join(EXCLUDABLE_COLUMNS)}",
            )
        if name not in names:
            names.append(name)
    return names


def _policy_to_dict(spec: PolicySpec) -> dict[str, Any]:
    out = dict(spec)
    for space_key in ("observation_space", "action_space"):
        if out[space_key] is not None:
            out[space_key] = space_to_spec(out[space_key])
    return out
