"""marl-runner: multi-agent episodes from PettingZoo envs into per-policy training batches.

Public names are imported lazily, so that ``marl_runner.config`` or an env
worker process does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "EnvRunner": "marl_runner.sampling.runner",
    "NoObservationError": "marl_runner.sampling.lifecycle",
    "SubEnvError": "marl_runner.sampling.lifecycle",
    "RunnerConfig": "marl_runner.config",
    "ConfigError": "marl_runner.config",
    "SampleBatch": "marl_runner.batch",
    "MultiAgentBatch": "marl_runner.batch",
    "concat_samples": "marl_runner.batch",
    "MultiAgentEpisode": "marl_runner.sampling.episode",
    "Callbacks": "marl_runner.callbacks",
    "TensorBoardCallbacks": "marl_runner.tensorboard",
    "RolloutMetrics": "marl_runner.metrics",
    "Policy": "marl_runner.policy",
    "TorchPolicy": "marl_runner.policy",
    "RandomPolicy": "marl_runner.policy",
    "check_batch_invariants": "marl_runner.checks",
    "save_checkpoint": "marl_runner.checkpoint",
    "restore_checkpoint": "marl_runner.checkpoint",
    "CheckpointError": "marl_runner.checkpoint",
    "BatchInvariantError": "marl_runner.checks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marl_runner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
