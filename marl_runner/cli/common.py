"""What every ``marl-runner`` subcommand shares: exit codes, the one-line error,
loading a config from the command line, what a failed runner build means, and
preparing ``--out`` and ``--metrics-out``.

The command modules in ``marl_runner.cli`` import this module; it imports
none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from connectors.imports import ImportPathError
from marl_runner.config import ConfigError, RunnerConfig
from marl_runner.config.memory import (
    BatchMemory,
    check_batch_memory,
    estimate_batch_memory,
    format_bytes,
)
from marl_runner.envs.errors import EnvError
from marl_runner.envs.pettingzoo_wrappers import AECPettingZooEnv
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.vector_backends import vector_backend
from marl_runner.io import FORMATS, list_batch_files, write_batch
from marl_runner.mapping import PolicyMappingError, make_policy_mapping_fn
from marl_runner.metrics_log import MetricsLogWriter
from marl_runner.safe_files import memory_limit_bytes

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_CONFIG = 2
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """A failure that deserves a one-line message and an exit code, not a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_CONFIG) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def load_config(path: Path, overrides: Sequence[str]) -> RunnerConfig:
    """The config at ``path`` with the ``--set KEY=VALUE`` overrides applied."""
    try:
        config = RunnerConfig.from_yaml(path)
        return config.with_overrides(overrides) if overrides else config
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc


def check_imports(config: RunnerConfig) -> None:
    """Imports what the config names (env, mapping, connectors) before anything is built."""
    try:
        config.check_imports()
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc


class MappingFailed(Exception):
    """The user's mapping function raised for an agent."""


class CheckedMapping:
    """The config's policy mapping, naming the agent when the user's function raises.

    ``validate`` and ``sample`` both hand it to the runner, so a mapping that
    raises while the runner is built is the same one-line error (exit 2) in
    both. Picklable, so Ray runners can take it too.
    """

    def __init__(self, config: RunnerConfig) -> None:
        try:
            self._mapping = make_policy_mapping_fn(config.policy_mapping_fn, list(config.policies))
        except PolicyMappingError as exc:
            raise CommandError(str(exc)) from exc
        except (TypeError, ImportPathError) as exc:
            raise CommandError(f"policy_mapping_fn: {exc}") from exc

    def __call__(self, agent_id: Any, episode: Any, **kwargs: Any) -> str:
        try:
            return self._mapping(agent_id, episode, **kwargs)
        except PolicyMappingError:
            raise
        except Exception as exc:
            raise MappingFailed(
                f"policy_mapping_fn failed for agent {agent_id!r}: {describe(exc)}"
            ) from exc


def check_memory(
    config: RunnerConfig,
    agents: Sequence[tuple[str, Any, Any]] = (),
    *,
    all_agents_act: bool = False,
) -> tuple[BatchMemory, int]:
    """Refuses (exit 2) a config whose batch cannot fit in this process's memory
    (``memory_limit_bytes``); returns the estimate and that limit. ``validate`` and
    ``sample`` both call it: first before anything is built (no agents: bookkeeping
    columns only), then with the env's possible agents and their spaces."""
    estimate = estimate_batch_memory(config, agents, all_agents_act=all_agents_act)
    limit = memory_limit_bytes()
    try:
        check_batch_memory(estimate, limit)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    _check_worker_processes(config, limit)
    return estimate, limit


#: What one env worker process takes at the least: an interpreter with numpy and an env.
WORKER_PROCESS_BYTES = 100 << 20


def _check_worker_processes(config: RunnerConfig, limit: int) -> None:
    """Refuses (exit 2) more subprocess workers than this process's memory holds at
    ``WORKER_PROCESS_BYTES`` each: ``num_workers: 100000`` passed every value check and
    would start that many interpreters."""
    if config.vectorize != "subprocess":
        return  # (Ray's actors may run on other machines; Ray places them)
    workers = config.num_workers or 1
    if workers * WORKER_PROCESS_BYTES > limit:
        raise CommandError(
            f"num_workers: {workers:,} worker processes of at least "
            f"{format_bytes(WORKER_PROCESS_BYTES)} each would take "
            f"{format_bytes(workers * WORKER_PROCESS_BYTES)}, more than the "
            f"{format_bytes(limit)} this process may use; use fewer workers"
        )


def probe_agents(
    config: RunnerConfig, mapping: Callable[..., str]
) -> tuple[list[tuple[str, Any, Any]], bool]:
    """``(policy id, obs space, action space)`` of each possible agent of one sub-env built
    here, and whether all agents act every step (not a turn-taking AEC env); an agent whose
    mapping needs a running episode is counted as ``"?"``. No agents for ``vectorize:
    external``: there is no env to build."""
    if vector_backend(config.vectorize).validate_with != "sync":
        return [], False  # the env is not built in this process (external)
    try:
        env = EnvFactory(config.env)(0)
    except Exception as exc:
        raise build_error(exc, config) from exc
    try:
        return agent_spaces(env, mapping), not isinstance(env, AECPettingZooEnv)
    finally:
        env.close()


def agent_spaces(env: Any, mapping: Callable[..., str]) -> list[tuple[str, Any, Any]]:
    """``(policy id, obs space, action space)`` of each of ``env``'s possible agents."""
    rows = []
    for agent in env.possible_agents:
        try:
            policy_id = mapping(agent, None)
        except Exception:
            policy_id = "?"
        rows.append((policy_id, env.get_observation_space(agent), env.get_action_space(agent)))
    return rows


def build_error(exc: Exception, config: RunnerConfig) -> CommandError:
    """What an exception raised while building the runner means: always a bad config (exit 2).

    Building runs only what the config names (env constructor, policies,
    connector chains, the mapping of the env's agents), so ``validate`` and
    ``sample`` both call this and agree on the exit code and the message.
    """
    if isinstance(exc, (ConfigError, ImportPathError, MappingFailed)):
        return CommandError(str(exc))
    if isinstance(exc, EnvError):
        return CommandError(f"env: cannot build {config.env['name']!r}: {describe(exc)}")
    return CommandError(f"cannot build the runner: {describe(exc)}")


#: The file in ``--out`` whose lock says a run writes there now (it stays, empty).
OUT_DIR_LOCK = ".marl-runner.lock"


def prepare_out_dir(out_dir: Path, config: RunnerConfig, stack: contextlib.ExitStack) -> None:
    """Refuses a directory holding another run's batches, or one another run writes to
    now; saves the resolved config there.

    Missing parent directories are made (``runs/`` in a fresh checkout).
    Runs before any env is built, so an unusable ``--out`` (under a file, not
    a directory, not writable) is a one-line error, not a traceback after
    minutes of sampling. Writing the config is the write test: a permission
    check alone would pass as root. The directory stays locked (``OUT_DIR_LOCK``)
    until ``stack`` closes: two runs started together into one directory would
    each find it empty and mix their files.
    """
    if not out_dir.exists():
        ancestor = next(path for path in out_dir.absolute().parents if path.exists())
        if not ancestor.is_dir():
            raise CommandError(f"--out {out_dir}: {ancestor} is not a directory")
    if out_dir.exists() and not out_dir.is_dir():
        raise CommandError(f"--out {out_dir}: exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = stack.enter_context((out_dir / OUT_DIR_LOCK).open("a"))
    except OSError as exc:
        raise CommandError(f"--out {out_dir}: cannot write there: {_os_error_text(exc)}") from None
    try:  # the kernel lets go of it with the process, however that ends
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise CommandError(
            f"--out {out_dir}: another run is writing there now; choose another directory"
        ) from None
    # (A Parquet batch's data files without their manifest: a run killed between the two.)
    earlier = list_batch_files(out_dir) or sorted(out_dir.glob("*/batch_*.parquet"))
    if earlier:
        raise CommandError(
            f"--out {out_dir}: already holds batch files from an earlier run ("
            f"{earlier[0].relative_to(out_dir)}); choose a new or empty directory"
        )
    try:
        (out_dir / "config.yaml").write_text(
            yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8"
        )
    except OSError as exc:
        raise CommandError(f"--out {out_dir}: cannot write there: {_os_error_text(exc)}") from None


def add_out_format_argument(parser: argparse.ArgumentParser) -> None:
    """``--format``: the file format of ``--out``, the same for ``sample`` and ``serve``."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,  # "npz" (see prepare_outputs): None tells that it was not given
        help="--out file format: npz (one DIR/batch_NNNNNN.npz per batch), or parquet (episode "
        "tables DIR/<policy>/batch_NNNNNN.parquet, readable by pandas, polars, DuckDB; "
        "docs/DATA.md); default npz",
    )


class BatchFileWriter:
    """Writes numbered batches to ``--out`` in the chosen format.

    Parquet files carry the env and every policy's spaces as schema metadata;
    policies are built when their first agent shows up, so the metadata is
    read from the runner (or group) again whenever a batch names a policy it
    does not cover yet, not once at the start.
    """

    def __init__(self, out_dir: Path, file_format: str, runner: Any) -> None:
        self.out_dir, self.file_format, self.runner = out_dir, file_format, runner
        self._metadata: dict[str, Any] | None = None

    def write(self, batch: Any, index: int) -> None:
        """Writes ``batch`` as batch number ``index`` (atomically; see ``write_batch``)."""
        if self.file_format != "parquet":
            write_batch(batch, self.out_dir, index, self.file_format)
            return
        if self._metadata is None or not set(batch.policy_batches) <= set(self._metadata["spaces"]):
            from marl_runner.io.parquet import parquet_metadata

            self._metadata = parquet_metadata(self.runner)
        write_batch(batch, self.out_dir, index, self.file_format, metadata=self._metadata)


def add_metrics_out_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-out FILE`` and ``--metrics-interval SECONDS``, the same for every command."""
    parser.add_argument(
        "--metrics-out",
        type=Path,
        metavar="FILE",
        help="write the metrics as JSON lines to FILE (created with its parent directories, "
        "replaced if it exists): one record per --metrics-interval and a last one when the "
        "command ends, also on Ctrl-C, SIGTERM or an error; see docs/METRICS.md, draw it with "
        "`marl-runner plot FILE`",
    )
    parser.add_argument(
        "--metrics-interval",
        type=non_negative_float,
        default=None,  # 10 (see prepare_outputs): None tells that it was not given
        metavar="SECONDS",
        help="with --metrics-out: seconds between records, at most one per batch "
        "(default: 10; 0: a record after every batch)",
    )


def prepare_outputs(
    args: argparse.Namespace, config: RunnerConfig, stack: contextlib.ExitStack
) -> MetricsLogWriter | None:
    """What a sampling command writes to, readied before any env is built and held until
    ``stack`` closes: ``--out`` checked, locked and holding the config, the
    ``--metrics-out`` log opened (None without it).
    An option that only shapes an output not asked for is an error, not ignored."""
    for option, value, needs in (
        ("--format", args.format, ("--out DIR", args.out)),
        ("--metrics-interval", args.metrics_interval, ("--metrics-out FILE", args.metrics_out)),
    ):
        if value is not None and needs[1] is None:
            raise CommandError(f"{option} {value} needs {needs[0]}: without it nothing is written")
    args.format = args.format or "npz"
    if args.metrics_interval is None:
        args.metrics_interval = 10.0
    if args.out is not None:
        prepare_out_dir(args.out, config, stack)
    if args.metrics_out is None:
        return None
    return stack.enter_context(open_metrics_log(args.metrics_out, args.metrics_interval))


def open_metrics_log(path: Path, interval_s: float) -> MetricsLogWriter:
    """The ``--metrics-out`` log, opened before any env is built so that an unusable
    path is a one-line error, not a traceback after minutes of sampling."""
    if path.is_dir():
        raise CommandError(f"--metrics-out {path}: is a directory; expected a file path")
    try:
        return MetricsLogWriter(path, interval_s)
    except OSError as exc:
        raise CommandError(
            f"--metrics-out {path}: cannot write there: {_os_error_text(exc)}"
        ) from None


def freeze_startup_objects() -> None:
    """Moves every object made so far (modules, torch, the runner) out of the garbage
    collector's reach: a full collection then scans only what came since, instead of
    stalling every request for about 100 ms each time (measured under `bench --external`)."""
    gc.collect()
    gc.freeze()


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, with a one-line message otherwise."""
    expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0, with a one-line message otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for one-line errors."""
    return f"{type(exc).__name__}: {exc}"


def _os_error_text(exc: OSError) -> str:
    """`strerror (path)` of an OSError, without Python's `[Errno N]` noise."""
    text = exc.strerror or str(exc)
    return f"{text} ({exc.filename})" if exc.filename else text
