"""marl-runner: multi-agent episodes from PettingZoo envs into per-policy training batches.

Every public name below is importable from `marl_runner` itself. They load on
first use, not at `import marl_runner`: env worker processes (`vectorize:
subprocess`, Ray sub-env actors) import `marl_runner.envs`, and so this
package, and most names here pull in torch, which would cost each worker
about 190 MB more memory and several seconds more start-up (measured: 47 MB
vs 239 MB resident). The `TYPE_CHECKING` imports (`X as X`, the form type
checkers take as a re-export) give IDEs and type checkers the same names;
`tests/test_api_reference.py` keeps the two lists equal. API reference:
`python scripts/build_api_docs.py`, then open build/api/index.html.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marl_runner.batch import MultiAgentBatch as MultiAgentBatch
    from marl_runner.batch import SampleBatch as SampleBatch
    from marl_runner.batch import concat_samples as concat_samples
    from marl_runner.callbacks import Callbacks as Callbacks
    from marl_runner.checkpoint import CheckpointError as CheckpointError
    from marl_runner.checkpoint import restore_checkpoint as restore_checkpoint
    from marl_runner.checkpoint import save_checkpoint as save_checkpoint
    from marl_runner.checks import BatchInvariantError as BatchInvariantError
    from marl_runner.checks import check_batch_invariants as check_batch_invariants
    from marl_runner.config import ConfigError as ConfigError
    from marl_runner.config import RunnerConfig as RunnerConfig
    from marl_runner.metrics import RolloutMetrics as RolloutMetrics
    from marl_runner.policy import Policy as Policy
    from marl_runner.policy import RandomPolicy as RandomPolicy
    from marl_runner.policy import TorchPolicy as TorchPolicy
    from marl_runner.sampling.episode import MultiAgentEpisode as MultiAgentEpisode
    from marl_runner.sampling.lifecycle import NoObservationError as NoObservationError
    from marl_runner.sampling.lifecycle import SubEnvError as SubEnvError
    from marl_runner.sampling.runner import EnvRunner as EnvRunner
    from marl_runner.tensorboard import TensorBoardCallbacks as TensorBoardCallbacks

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
    """Import a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marl_runner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
