"""Saving a runner to one file and building an equal runner from it.

A checkpoint holds what is needed to go on sampling where a runner left off,
policy-wise: the runner config (``config.to_dict()``), and per policy its
weights, its agent and action connector chains with their state (e.g. the
observation filter statistics) and the policy's own state (e.g. the seeded
sampling generator, so a restored policy draws the same actions).

What it does NOT hold: running episodes (a restored runner starts fresh
episodes; env RNGs start from the config's ``seed``), and anything that is
not part of the config: ready-made ``Policy`` objects, a callable policy
mapping fn or a ``Callbacks`` instance given to ``EnvRunner`` directly. Pass
those again to ``restore_checkpoint`` (``**runner_kwargs``); the weights
and connector state of such policies are still restored from the file.

File format: one ``pickle`` (highest protocol) of a plain dict::

    {"format": "marl-runner-checkpoint", "version": 1,
     "config": {...},                      # RunnerConfig.to_dict()
     "policies": {policy_id: {
         "weights": {...},                 # runner.get_state()[policy_id]
         "agent_connectors": [(name, params), ...],
         "action_connectors": [(name, params), ...],
         "policy_state": {...}}}}          # Policy.get_state()

It is written atomically: to a hidden temp file in the target's directory,
flushed and fsynced, then renamed over the target (``os.replace``), so a
reader sees the old checkpoint or the new one, never half of one. Unpickling
runs code from the file: only restore checkpoints you trust (as with
``torch.load``).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl_runner.config import RunnerConfig

if TYPE_CHECKING:
    from marl_runner.sampling.runner import EnvRunner

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointError",
    "load_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
]

FORMAT_NAME = "marl-runner-checkpoint"
FORMAT_VERSION = 1
_STATE_KEYS = ("weights", "agent_connectors", "action_connectors")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or that does not fit the runner built from it."""


def save_checkpoint(runner: EnvRunner, path: str | os.PathLike[str]) -> Path:
    """Writes ``runner``'s config, weights and connector state to ``path`` atomically.

    Creates the parent directory if needed and replaces an existing file.
    Returns the path written.
    """
    path = Path(path)
    policies: dict[str, dict[str, Any]] = {}
    policy_map = runner.policy_map
    for policy_id, state in runner.get_state().items():
        entry = {key: state[key] for key in _STATE_KEYS if key in state}
        policy = policy_map.get(policy_id)
        if policy is not None:
            entry["policy_state"] = policy.get_state()
        policies[policy_id] = entry
    payload = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "config": runner.config.to_dict(),
        "policies": policies,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            pickle.dump(payload, tmp_file, protocol=pickle.HIGHEST_PROTOCOL)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's dict (see the module docstring), checked for format and version."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            payload = pickle.load(file)
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as err:
        raise CheckpointError(f"{path} is not a readable marl-runner checkpoint: {err!r}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{path} is not a marl-runner checkpoint (expected a dict with format {FORMAT_NAME!r})"
        )
    if payload.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {payload.get('version')!r} is not supported "
            f"(this marl-runner reads version {FORMAT_VERSION})"
        )
    for key in ("config", "policies"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path}: checkpoint has no {key!r} dict")
    return payload


def restore_checkpoint(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] | None = None,
    runner_cls: type[EnvRunner] | None = None,
    **runner_kwargs: Any,
) -> EnvRunner:
    """A new ``EnvRunner`` built from the checkpoint's config, with its weights and connector state.

    ``overrides`` are ``"dotted.key=value"`` config overrides applied before
    the runner is built (e.g. ``["num_envs=16"]``); ``runner_kwargs`` go to
    ``EnvRunner`` (``policies``, ``policy_mapping_fn``, ``callbacks``), for
    what the config cannot hold. ``runner_cls`` builds a subclass instead
    (what ``EnvRunner.restore`` passes as ``cls``).

    Raises:
        CheckpointError: unreadable file, unknown format or version, or a
            checkpointed policy the restored runner does not have.
    """
    from marl_runner.sampling.runner import EnvRunner

    payload = load_checkpoint(path)
    config = RunnerConfig.from_dict(payload["config"])
    if overrides:
        config = config.with_overrides(overrides)
    runner = (runner_cls or EnvRunner)(config, **runner_kwargs)
    try:
        _apply_state(runner, payload["policies"], path)
    except BaseException:
        runner.stop()
        raise
    return runner


def _apply_state(runner: EnvRunner, policies: dict[str, Any], path: Any) -> None:
    policy_map = runner.policy_map
    missing = sorted(set(policies) - set(policy_map))
    if missing:
        raise CheckpointError(
            f"{path}: the restored runner has no policies {missing} (it has "
            f"{sorted(policy_map)}); policies added with add_policy() or built only when "
            "their first agent appears must be passed as policies= to restore them"
        )
    runner.set_state(
        {pid: {key: state[key] for key in _STATE_KEYS} for pid, state in policies.items()}
    )
    for pid, state in policies.items():
        if "policy_state" in state:
            policy_map[pid].set_state(state["policy_state"])


def _fsync_dir(directory: Path) -> None:
    """Makes the rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
