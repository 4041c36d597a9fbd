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

The file is JSON and raw numeric arrays with a checksum, never pickle (see
``marl_runner.checkpoint.file_format``). The checksum only catches accidents:
anyone can write a valid file. So the file is treated as data:
``restore_checkpoint`` refuses import paths that come from it (``env.name:
os:system``, callbacks, policy classes, mapping fns, custom models and
connectors) unless the caller opts in with ``trusted=True``, ``allow=[...]``
or its own ``config=`` (see its docstring and ``marl_runner.checkpoint.trust``).

It is written atomically: to a hidden temp file in the target's directory,
flushed and fsynced, then renamed over the target (``os.replace``), so a
reader sees the old checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl_runner.checkpoint.file_format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    STATE_KEYS,
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
)
from marl_runner.checkpoint.model_shapes import check_model_shapes
from marl_runner.checkpoint.trust import ImportRef, chain_imports, config_imports
from marl_runner.config import ConfigError, RunnerConfig
from marl_runner.config.memory import check_batch_memory, estimate_batch_memory
from marl_runner.safe_files import FileRefused, memory_limit_bytes, read_regular_file

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # the runner imports torch: only when a checkpoint is restored
    from marl_runner.sampling.runner import EnvRunner

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointError",
    "ImportRefused",
    "checkpoint_config",
    "load_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
    "write_checkpoint",
]


def save_checkpoint(runner: EnvRunner, path: str | os.PathLike[str]) -> Path:
    """Writes ``runner``'s config, weights and connector state to ``path`` atomically.

    Creates the parent directory if needed and replaces an existing file.
    Returns the path written.
    """
    policies: dict[str, dict[str, Any]] = {}
    policy_map = runner.policy_map
    for policy_id, state in runner.get_state().items():
        entry = {key: state[key] for key in STATE_KEYS if key in state}
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
    return write_checkpoint(payload, path)


def write_checkpoint(payload: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Writes a checkpoint dict (as ``load_checkpoint`` returns it) to ``path`` atomically."""
    path = Path(path)
    data = encode_checkpoint(payload, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            tmp_file.write(data)
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
    """The checkpoint's dict (``format``, ``version``, ``config``, ``policies``), every
    field checked (see ``marl_runner.checkpoint.file_format``). Never runs code from the file.

    Only a regular file is read (a symlink to one is followed; a FIFO or a device is
    refused without blocking), and only when its size is at most ``max_checkpoint_bytes``.
    """
    path = Path(path)
    try:
        data = read_regular_file(path, max_bytes=max_checkpoint_bytes())
    except FileRefused as err:
        raise CheckpointError(f"cannot read checkpoint {path}: it {err}") from None
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    return decode_checkpoint(data, path)


def max_checkpoint_bytes() -> int:
    """The largest checkpoint ``load_checkpoint`` reads: half the memory this process may
    use (``memory_limit_bytes``), since decoding holds the file and its arrays at once."""
    return memory_limit_bytes() // 2


def restore_checkpoint(
    path: str | os.PathLike[str],
    *,
    config: RunnerConfig | Mapping[str, Any] | None = None,
    trusted: bool = False,
    allow: Iterable[str] = (),
    overrides: Iterable[str] | None = None,
    runner_cls: type[EnvRunner] | None = None,
    **runner_kwargs: Any,
) -> EnvRunner:
    """A new ``EnvRunner`` built from the checkpoint's config, with its weights and connector state.

    Safe by default, like ``torch.load(weights_only=True)``: an import path
    that comes from the file (a ``module:callable`` env name, mapping fn,
    callbacks, policy class, model class, ``module:Class`` connector or a
    lambda connector's ``fn``, in the config or in the connector state) is
    refused with a ``CheckpointError`` naming the file, the field and the
    value, because importing and calling it runs code whoever wrote the file
    chose. Registered env and connector names, ``TorchPolicy`` /
    ``RandomPolicy``, built-in model types and the PettingZoo / MPE2 env
    constructors are data and need no opt-in. To opt in, either:

    - ``trusted=True``: the file is yours; import whatever it names;
    - ``allow=["mypkg.envs:make_env", ...]``: import exactly these paths;
    - ``config=my_config``: build the runner from your config (its import
      paths are yours) and read only weights and connector state from the
      file; connector state naming other import paths still needs ``allow``.

    ``overrides`` are ``"dotted.key=value"`` config overrides applied before
    the runner is built (e.g. ``["num_envs=16"]``); import paths they set are
    the caller's. ``runner_kwargs`` go to ``EnvRunner`` (``policies``,
    ``policy_mapping_fn``, ``callbacks``), for what the config cannot hold.
    ``runner_cls`` builds a subclass instead.

    Before anything is built, the config's batch must fit in memory
    (``marl_runner.config.memory``: ``num_envs: 10000000`` is refused), and each
    policy's weights are checked against the model
    its config asks for (``check_model_shapes``: built-in model types, compared
    on torch's meta device), so a file whose config asks for a huge model fails
    without allocating it.

    Raises:
        CheckpointError: unreadable, corrupt (checksum) or malformed file,
            unknown format or version, an import path from the file that was
            not opted into, weights that do not fit the config's model, or a
            checkpointed policy the restored runner does not have.
    """
    payload, runner_config = _load_checked(path, config, trusted, allow, overrides)
    try:  # num_envs: 10000000 from a file would build sub-envs until memory runs out
        check_batch_memory(estimate_batch_memory(runner_config), memory_limit_bytes())
    except ConfigError as err:
        raise CheckpointError(f"{path}: checkpoint field config: {err}") from None
    ready_made = set(runner_kwargs.get("policies") or ())
    check_model_shapes(
        {pid: state for pid, state in payload["policies"].items() if pid not in ready_made},
        runner_config,
        path,
    )
    if runner_cls is None:
        from marl_runner.sampling.runner import EnvRunner

        runner_cls = EnvRunner
    runner = runner_cls(runner_config, **runner_kwargs)
    try:
        _apply_state(runner, payload["policies"], path)
    except BaseException:
        runner.stop()
        raise
    return runner


def checkpoint_config(
    path: str | os.PathLike[str],
    *,
    config: RunnerConfig | Mapping[str, Any] | None = None,
    trusted: bool = False,
    allow: Iterable[str] = (),
    overrides: Iterable[str] | None = None,
) -> RunnerConfig:
    """The config ``restore_checkpoint`` with these arguments would build its runner from,
    after the same checks (nothing is imported or built).

    For callers that need the config first (e.g. to wrap the config's callbacks class):
    pass the result back as ``restore_checkpoint(path, config=..., allow=...)``.
    """
    return _load_checked(path, config, trusted, allow, overrides)[1]


def _load_checked(
    path: str | os.PathLike[str],
    config: RunnerConfig | Mapping[str, Any] | None,
    trusted: bool,
    allow: Iterable[str],
    overrides: Iterable[str] | None,
) -> tuple[dict[str, Any], RunnerConfig]:
    """The loaded payload and the config to build from, import paths checked unless trusted."""
    if isinstance(allow, str):
        raise TypeError(f"allow: got the string {allow!r}, expected a list of import paths")
    payload = load_checkpoint(path)
    if config is None:
        try:
            base = RunnerConfig.from_dict(payload["config"])
        except (ValueError, TypeError) as err:
            raise CheckpointError(f"{path}: checkpoint field config is not valid: {err}") from None
        from_file = set(config_imports(base))
    else:
        base = config if isinstance(config, RunnerConfig) else RunnerConfig.from_dict(config)
        from_file = set()
    runner_config = base.with_overrides(overrides) if overrides else base
    if not trusted:
        _refuse_file_imports(payload["policies"], runner_config, from_file, set(allow), path)
        if config is None:
            _refuse_many_processes(runner_config, overrides, path)
    return payload, runner_config


#: The keys that say how many env processes a config starts; overriding any of them makes
#: the count the caller's, not the file's.
_PROCESS_KEYS = {"vectorize", "num_workers", "num_envs"}


def _refuse_many_processes(
    config: RunnerConfig, overrides: Iterable[str] | None, path: str | os.PathLike[str]
) -> None:
    """A file's config starts at most one env process per CPU core: each is an interpreter
    with its envs (100 MB or more), which the batch estimate does not count, so a small
    file asking for dozens would take gigabytes. Overriding ``_PROCESS_KEYS``, or
    ``trusted``, lifts it."""
    if _PROCESS_KEYS & {override.split("=", 1)[0].strip() for override in overrides or ()}:
        return
    cores = os.cpu_count() or 1
    if config.vectorize == "subprocess":
        processes, key = config.num_workers or min(config.num_envs, cores), "num_workers"
    elif config.vectorize == "ray":
        processes, key = config.num_envs, "num_envs"  # one actor per sub-env
    else:
        return
    if processes > cores:
        raise CheckpointError(
            f"{path}: checkpoint field config asks for {processes} env processes "
            f"(vectorize: {config.vectorize}, {key}: {getattr(config, key)}) on {cores} CPU "
            "cores; a checkpoint's config may start at most one per core: lower it with "
            "overrides (e.g. ['vectorize=sync']; `--set vectorize=sync` on the command line), "
            "or pass trusted=True for a file you made"
        )


def _refuse_file_imports(
    policies: dict[str, Any],
    config: RunnerConfig,
    from_file: set[ImportRef],
    allow: set[str],
    path: str | os.PathLike[str],
) -> None:
    """Raises unless every import path the file chose is one the caller allowed or gave."""
    in_config = config_imports(config)
    allowed = allow | {value for key, value in in_config if (key, value) not in from_file}
    refs = [ref for ref in in_config if ref in from_file]
    for pid, state in policies.items():
        for kind in ("agent_connectors", "action_connectors"):
            try:
                refs += chain_imports(state[kind], f"policies.{pid}.{kind}")
            except ValueError as err:
                raise CheckpointError(f"{path}: checkpoint field {err}") from None
    refused = [(key, value) for key, value in refs if value not in allowed]
    if refused:
        raise ImportRefused(path, refused)


class ImportRefused(CheckpointError):
    """Import paths named by a checkpoint that the caller did not opt into.

    ``str()`` words the way out in Python (``trusted=True``, ``allow=[...]``);
    ``cli_message()`` in ``marl-runner evaluate`` flags (``--trusted``, ``--allow``).
    """

    def __init__(self, path: str | os.PathLike[str], refused: list[ImportRef]) -> None:
        self.path, self.refused = path, refused
        self.paths = list(dict.fromkeys(value for _, value in refused))
        listed = ", ".join(repr(v) for v in self.paths)
        super().__init__(
            f"{self._what()} If you trust this file, pass trusted=True, or allow=[{listed}], "
            "or your own config= (then only weights and connector state come from the file)"
        )

    def cli_message(self) -> str:
        """The same refusal, naming the command-line flags instead of Python arguments."""
        allows = " ".join(f"--allow {value}" for value in self.paths)
        return (
            f"{self._what()} If you trust this file, pass --trusted, or {allows}, or replace "
            "the entry with --set KEY=VALUE"
        )

    def _what(self) -> str:
        key, value = self.refused[0]
        also = "".join(f"; also {k} = {v!r}" for k, v in self.refused[1:])
        return (
            f"{self.path}: checkpoint field {key} names the import path {value!r}{also}. "
            "Restoring never imports names that come from the file, because importing and "
            "calling them runs code."
        )


def _apply_state(runner: EnvRunner, policies: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Sets each checkpointed policy's state on ``runner``; any mismatch is a CheckpointError."""
    policy_map = runner.policy_map
    missing = sorted(set(policies) - set(policy_map))
    unmapped = [pid for pid in missing if pid in runner.config.policies]
    if unmapped:  # in the config, but no agent maps to them (an override's mapping, say)
        logger.warning(
            "%s: no agent maps to policies %s under this policy_mapping_fn, so they were not "
            "built; their saved state is not restored", path, unmapped,
        )
        policies = {pid: state for pid, state in policies.items() if pid not in unmapped}
        missing = [pid for pid in missing if pid not in unmapped]
    if missing:
        raise CheckpointError(
            f"{path}: the restored runner has no policies {missing} (it has "
            f"{sorted(policy_map)}); policies added with add_policy() or built only when "
            "their first agent appears must be passed as policies= to restore them"
        )
    try:
        runner.set_state(
            {pid: {key: state[key] for key in STATE_KEYS} for pid, state in policies.items()}
        )
        for pid, state in policies.items():
            if "policy_state" in state:
                policy_map[pid].set_state(state["policy_state"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise CheckpointError(
            f"{path}: checkpoint state does not fit the restored runner: {type(err).__name__}: {err}"
        ) from None


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
