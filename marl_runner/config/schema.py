"""What a config may say: the choices, the keys of ``env`` and of a policy, their texts.

The reference (docs/CONFIG.md, ``marl-runner config-doc``) is written from
these tables and from ``RunnerConfig``'s fields, so they are the one place a
key is described. The keys of the built-in model types live with the models
(``marl_runner.policy.models.MODEL_KEYS``).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import gymnasium as gym

__all__ = [
    "ACTIVATIONS",
    "BATCH_MODES",
    "BUILTIN_POLICY_CLASSES",
    "DEVICES",
    "ENV_APIS",
    "ENV_KEYS",
    "EXCLUDABLE_COLUMNS",
    "FAKE_OBS_MODES",
    "MAX_LAYER_WIDTH",
    "MAX_MODEL_LAYERS",
    "MAX_MODEL_PARAMETERS",
    "MAX_RUNNERS",
    "MAX_TORCH_THREADS",
    "POLICY_KEYS",
    "REQUIRED_HINTS",
    "STEP_COUNTS",
    "EnvSpec",
    "PolicySpec",
    "model_keys",
]

ENV_APIS = ("auto", "parallel", "aec", "multi_agent")
BATCH_MODES = ("truncate_episodes", "complete_episodes")
STEP_COUNTS = ("env_steps", "agent_steps")
FAKE_OBS_MODES = ("zeros", "sample", "last")
#: Batch columns ``exclude_columns`` may leave out: none that a transition, its trajectory
#: or a policy's own outputs are read from.
EXCLUDABLE_COLUMNS = (
    "new_obs", "new_env_state", "infos", "env_t", "policy_version", "agent_id", "unroll_id",
    "action_dist_inputs",
)  # fmt: skip
DEVICES = ("cpu", "cuda", "auto")
ACTIVATIONS = ("tanh", "relu")
#: The most inference threads a config may ask for (torch takes a C int; no machine has more
#: cores).
MAX_TORCH_THREADS = 1024
#: Remote runners a group may ask for (far beyond any cluster this runs on).
MAX_RUNNERS = 10_000
#: The most parameters a built-in model may have before the env's sizes are added (the
#: weights its config alone asks for, e.g. ``hidden`` times ``hidden``): 50M float32 is
#: 200 MB, 15 times a Nature CNN's policy and value trunks on 84x84 frames (3.4M).
MAX_MODEL_PARAMETERS = 50_000_000
#: The widest layer (hidden size, LSTM cell, conv channels, kernel, stride) a built-in model
#: may have: with the env's obs size, one layer's weights are this times that.
MAX_LAYER_WIDTH = 65_536
#: The most layers in ``hidden`` or ``conv``: 20,000 one-wide layers took 485 MB and 7 s to
#: build; real models have a handful.
MAX_MODEL_LAYERS = 64
#: Policy classes named without an import path (see marl_runner.policy.build_policy).
BUILTIN_POLICY_CLASSES = ("TorchPolicy", "RandomPolicy")

#: The keys of ``env``, with their reference text.
ENV_KEYS = {
    "name": "'module:callable' returning a PettingZoo env or a MultiAgentEnv, or a name "
    "given to marl_runner.envs.register_env. Required. In a Python config (from_dict, "
    "EnvRunner) also the env class or function itself: one with an import path is stored "
    "as that path; one without (defined in __main__, a lambda, a local class) is registered "
    "in this process as '<module>.<name>' and saved under that name.",
    "config": "Keyword arguments for that callable. Default: {}.",
    "api": "auto (detected), parallel, aec or multi_agent (a marl_runner MultiAgentEnv). "
    "Default: auto.",
    "capture_state": "Record the env's global state (PettingZoo's state()) on every row, for "
    "centralised critics: env_state (with obs) and new_env_state (with new_obs) columns, "
    "computed where the env runs (any vectorize mode), never part of the observation. A "
    "PettingZoo env without state() is an error when the runner is built. Default: false.",
}
#: The keys of one policy under ``policies``, with their reference text.
POLICY_KEYS = {
    "model": "The torch model: {type: mlp|lstm|cnn, ...} (keys below) or {class: "
    "'pkg.mod:Cls', ...} whose other keys go to Cls(obs_dim, num_outputs, **kwargs). "
    f"Default: {{type: mlp}}. A built-in model has at most {MAX_MODEL_LAYERS} layers in "
    f"hidden and in conv, sizes (hidden, lstm_cell_size, conv) of at most {MAX_LAYER_WIDTH:,}, "
    "and weights, counted with one obs value and one output (the part its config alone "
    f"sets), of at most {MAX_MODEL_PARAMETERS:,}; with the env's sizes (the observation the "
    "agent connectors make), at most 250,000,000 (checked when the model is built).",
    "policy_class": "TorchPolicy, RandomPolicy or 'pkg.mod:Cls' naming a Policy subclass. "
    "Default: TorchPolicy.",
    "agent_connectors": "The agent connector chain: a list of names or {name: ..., <param>: "
    "...} mappings (see docs/CONNECTORS.md). Null: the default chain; []: none.",
    "action_connectors": "The action connector chain, likewise. Null: the default chain; []: none.",
    "observation_space": "The env-side observation space, e.g. {type: Box, low: -1.0, high: "
    "1.0, shape: [3]}; must fit the agents mapped to the policy. Null: taken from them.",
    "action_space": "The env-side action space, e.g. {type: Discrete, n: 6}; must fit the "
    "agents mapped to the policy. Null: taken from them.",
    "config": "Policy settings passed to the policy class (gamma, lambda, "
    "view_requirements, ...). Default: {}.",
}

#: What the two required top-level keys must hold, for "missing" and "got ..." messages.
REQUIRED_HINTS = {
    "env": "expected a mapping with 'name' (e.g. 'pettingzoo.classic.tictactoe_v3:env'), "
    "and optionally 'config' and 'api'",
    "policies": "expected a mapping of policy id -> policy spec with at least one policy",
}


class EnvSpec(TypedDict):
    """How to build one sub-environment; the argument of ``marl_runner.envs.make_env``."""

    name: str  # "module:callable" or a name given to register_env
    config: dict[str, Any]  # keyword arguments for the callable
    api: str  # one of ENV_APIS
    capture_state: NotRequired[bool]  # present (True) only when asked for


class PolicySpec(TypedDict):
    """How to build one policy. None for a connector chain means the default chain."""

    model: dict[str, Any]  # {"type": "mlp"|"lstm"|"cnn", ...} or {"class": "pkg.mod:Cls", ...}
    policy_class: str | None
    agent_connectors: list[str | dict[str, Any]] | None
    action_connectors: list[str | dict[str, Any]] | None
    observation_space: gym.Space | None  # None: taken from the env agents mapped to it
    action_space: gym.Space | None
    config: dict[str, Any]


def model_keys() -> dict[str, dict[str, str]]:
    """``MODEL_KEYS`` of ``marl_runner.policy.models``: the keys of each built-in model type.

    Imported when a model spec is checked, not with this module, so that
    importing the config package does not import torch.
    """
    from marl_runner.policy.models import MODEL_KEYS

    return MODEL_KEYS
