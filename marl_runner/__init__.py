"""marl-runner: multi-agent episodes from PettingZoo envs into per-policy training batches.

Every public name below is importable from `marl_runner` itself. They load on
first use, not at `import marl_runner`: env worker processes (`vectorize:
subprocess`, Ray sub-env actors) import `marl_runner.envs`, and so this
package, and most names here pull in torch, which would cost each worker
about 190 MB more memory and several seconds more start-up (measured: 47 MB
vs 239 MB resident).

The names are listed once, in the `TYPE_CHECKING` block: type checkers and
IDEs read it as re-exports (`X as X`), and `_public_names` reads the same
block at import time to know which module defines each name. Modules inside
the package import from the defining module, never from here (this module is
the top layer, see docs/DESIGN.md). API reference: `python
scripts/build_api_docs.py`, then open build/api/index.html.
"""

from __future__ import annotations

import ast
import importlib
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from connectors.registry import register_connector as register_connector
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
    from marl_runner.distributed.runner_group import EnvRunnerGroup as EnvRunnerGroup
    from marl_runner.envs.registry import register_env as register_env
    from marl_runner.envs.vector_backends import register_vector_backend as register_vector_backend
    from marl_runner.io.batch_files import read_batches as read_batches
    from marl_runner.metrics import RolloutMetrics as RolloutMetrics
    from marl_runner.policy import Policy as Policy
    from marl_runner.policy import RandomPolicy as RandomPolicy
    from marl_runner.policy import TorchPolicy as TorchPolicy
    from marl_runner.sampling.episode import MultiAgentEpisode as MultiAgentEpisode
    from marl_runner.sampling.lifecycle import NoObservationError as NoObservationError
    from marl_runner.sampling.lifecycle import SubEnvError as SubEnvError
    from marl_runner.sampling.runner import EnvRunner as EnvRunner
    from marl_runner.tensorboard import TensorBoardCallbacks as TensorBoardCallbacks

#: The installed distribution's version: pyproject.toml is its one source.
__version__ = version("marl-runner")


def _public_names() -> dict[str, str]:
    """``name -> defining module``, read from the ``TYPE_CHECKING`` block of this file."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    (block,) = (
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_EXPORTS = _public_names()
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
