"""Build a MultiAgentEnv from an `env` config: a registered name or an import path."""

from __future__ import annotations

import importlib
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

from pettingzoo import AECEnv, ParallelEnv

from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentEnv
from marl_runner.envs.pettingzoo_wrappers import AECPettingZooEnv, ParallelPettingZooEnv

EnvCreator = Callable[[dict[str, Any]], Any]
#: Values in messages are cut short: an env config can be large, or a YAML alias bomb.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 6
_REPR.maxlevel = 3
_short = _REPR.repr
API_CHOICES = ("auto", "parallel", "aec", "multi_agent")
_ENV_CONFIG_KEYS = ("name", "config", "api", "capture_state")
_API_CLASSES: dict[str, type] = {
    "parallel": ParallelEnv,
    "aec": AECEnv,
    "multi_agent": MultiAgentEnv,
}

_registered_creators: dict[str, EnvCreator] = {}


def register_env(name: str, creator: EnvCreator) -> None:
    """Make `name` usable as `env.name`.

    As in RLlib, `creator` is called with the env's `config` dict as its one
    argument and returns a MultiAgentEnv or a PettingZoo env. Registering a
    name again replaces its creator. Registrations live in this process:
    `vectorize: subprocess` ships the creator to its workers by pickling, so
    it must then be a module-level function, not a lambda.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise EnvError(f"register_env name {name!r}: expected a non-empty string without ':'")
    if not callable(creator):
        raise EnvError(f"register_env({name!r}): creator {creator!r} is not callable")
    _registered_creators[name] = creator


def make_env(env_config: Mapping[str, Any] | Any) -> MultiAgentEnv:
    """Create and wrap the env that `env_config` (`name`, `config`, `api`) describes."""
    return EnvFactory(env_config)()


class EnvFactory:
    """A picklable `make_one(index) -> MultiAgentEnv` for vector envs.

    It holds the validated env config, plus the creator when `name` is a
    registered one, so that worker processes (which start with an empty
    registry) can build the env too.
    """

    def __init__(self, env_config: Mapping[str, Any] | Any) -> None:
        self.name, self.config, self.api = _read_env_config(env_config)
        self.capture_state = _capture_state(env_config)
        self.registered_creator = _registered_creators.get(self.name)
        if self.registered_creator is None:
            _import_callable(self.name)  # fail here, not in a worker process

    def __call__(self, index: int = 0) -> MultiAgentEnv:
        """Build one env; every sub-env index gets the same kind of env."""
        if self.registered_creator is not None:
            env = _call_creator(self.name, self.registered_creator, self.config, as_kwargs=False)
        else:
            env = _call_creator(self.name, _import_callable(self.name), self.config, as_kwargs=True)
        return _wrap(env, self.api, self.name, self.capture_state)


def _read_env_config(env_config: Mapping[str, Any] | Any) -> tuple[str, dict[str, Any], str]:
    """`(name, config, api)` from a dict or an object with those attributes."""
    if isinstance(env_config, Mapping):
        unknown = [key for key in env_config if key not in _ENV_CONFIG_KEYS]
        if unknown:
            raise EnvError(
                f"env config has unknown keys {unknown}; expected only {list(_ENV_CONFIG_KEYS)}"
            )
        fields = env_config
    else:
        fields = {
            key: getattr(env_config, key) for key in _ENV_CONFIG_KEYS if hasattr(env_config, key)
        }
    name = fields.get("name")
    config = fields.get("config") or {}
    api = fields.get("api") or "auto"
    if not isinstance(name, str) or not name:
        raise EnvError(
            f"env.name {_short(name)}: expected a registered env name or a 'module:callable' path"
        )
    if not isinstance(config, Mapping):
        raise EnvError(
            f"env.config for {name!r}: expected a mapping of keyword arguments, got {_short(config)}"
        )
    if api not in API_CHOICES:
        raise EnvError(f"env.api {_short(api)} for {name!r}: expected one of {list(API_CHOICES)}")
    return name, dict(config), api


def _import_callable(name: str) -> Callable[..., Any]:
    """Resolve `"pkg.module:attr.path"` to a callable."""
    module_name, _, attr_path = name.partition(":")
    if not module_name or not attr_path:
        raise EnvError(
            f"env.name {name!r}: not a registered env (registered: {sorted(_registered_creators)}) "
            "and not a 'module:callable' import path"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise EnvError(
            f"env.name {name!r}: module {module_name!r} could not be imported: {exc}"
        ) from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise EnvError(
                f"env.name {name!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if not callable(target):
        raise EnvError(
            f"env.name {name!r}: {target!r} is not callable; expected an env class or function"
        )
    return target


def _call_creator(
    name: str, creator: Callable[..., Any], config: dict[str, Any], *, as_kwargs: bool
) -> Any:
    """Import paths take the config as keyword arguments, registered creators as one dict."""
    try:
        return creator(**config) if as_kwargs else creator(dict(config))
    except Exception as exc:
        raise EnvError(
            f"env.name {name!r}: creating the env with config {_short(config)} failed with "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _capture_state(env_config: Mapping[str, Any] | Any) -> bool:
    """``env.capture_state``: whether the PettingZoo wrapper hands out ``env.state()``."""
    if isinstance(env_config, Mapping):
        return bool(env_config.get("capture_state", False))
    return bool(getattr(env_config, "capture_state", False))


def _wrap(env: Any, api: str, name: str, capture_state: bool = False) -> MultiAgentEnv:
    """Put the right MultiAgentEnv adapter around what the creator returned."""
    if capture_state and not isinstance(env, (ParallelEnv, AECEnv)):
        raise EnvError(
            f"env.capture_state is true, but env.name {name!r} returned a "
            f"{type(env).__qualname__}, not a PettingZoo env (ParallelEnv or AECEnv) with "
            "state(); a MultiAgentEnv of one's own can put its state in each agent's infos under "
            "connectors.ENV_STATE_INFO_KEY and list EnvStateAgentConnector in agent_connectors"
        )
    if api == "auto":
        if isinstance(env, MultiAgentEnv):
            return env
        if isinstance(env, ParallelEnv):
            return ParallelPettingZooEnv(env, capture_state)
        if isinstance(env, AECEnv):
            return AECPettingZooEnv(env, capture_state)
        raise EnvError(
            f"env.name {name!r} returned a {type(env).__qualname__}; expected a marl_runner "
            "MultiAgentEnv, a pettingzoo.ParallelEnv or a pettingzoo.AECEnv"
        )
    expected = _API_CLASSES[api]
    if not isinstance(env, expected):
        raise EnvError(
            f"env.api {api!r} expects env.name {name!r} to return a "
            f"{expected.__module__}.{expected.__qualname__}, got a {type(env).__qualname__} "
            "(api 'auto' detects the kind)"
        )
    if api == "parallel":
        return ParallelPettingZooEnv(env, capture_state)
    if api == "aec":
        return AECPettingZooEnv(env, capture_state)
    return env
