"""``marl-runner sample``: sample with live progress, write the batches, print the metrics."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from marl_runner.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    BatchFileWriter,
    CheckedMapping,
    CommandError,
    add_metrics_out_arguments,
    add_out_format_argument,
    build_error,
    check_imports,
    check_memory,
    describe,
    load_config,
    non_negative_int,
    positive_int,
    prepare_outputs,
    probe_agents,
)
from marl_runner.cli.display import print_run_summary
from marl_runner.cli.stopping import GracefulStop, exit_code_of
from marl_runner.config import RunnerConfig
from marl_runner.config.schema import MAX_RUNNERS
from marl_runner.metrics_log import MetricsLogWriter, RunMetrics
from marl_runner.progress import (
    ProgressReporter,
    SampleCounts,
    count_batch,
    count_batches,
    make_progress,
)

__all__ = ["add_sample_parser", "run_sample"]

logger = logging.getLogger(__name__)


def add_sample_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Registers ``sample`` (``common``: config, --set, --traceback)."""
    sample = commands.add_parser(
        "sample",
        parents=[common],
        help="sample with a live progress bar and print metrics at the end",
        description="Sample episodes with the config's runner, showing progress; print a "
        "metrics table at the end and optionally write every batch to --out.",
    )
    target = sample.add_mutually_exclusive_group()
    target.add_argument(
        "--steps",
        type=positive_int,
        metavar="N",
        help="stop after at least N steps in the produced batches (env steps unless "
        "--count-steps-by agent_steps); default: one rollout fragment per sub-env, "
        "i.e. num_envs * rollout_fragment_length steps counted as the config's count_steps_by",
    )
    target.add_argument(
        "--episodes",
        type=positive_int,
        metavar="N",
        help="stop after N episodes have finished (faulty ones not counted); the last batch "
        "holds the rows not yet in a full fragment, so every finished episode is written",
    )
    sample.add_argument(
        "--count-steps-by",
        choices=("env_steps", "agent_steps"),
        default="env_steps",
        help="what --steps counts (default: env_steps)",
    )
    sample.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write each batch as soon as it is produced (atomically, in --format, readable "
        "with marl_runner.io.read_batches) plus the resolved config as DIR/config.yaml; "
        "DIR must not already hold batch files, nor be written to by another run",
    )
    add_out_format_argument(sample)
    sample.add_argument(
        "--runners",
        type=non_negative_int,
        metavar="N",
        help="sample with N runners in Ray actors (an EnvRunnerGroup), in parallel; 0: one "
        "runner in this process; default: the config's num_runners (0)",
    )
    sample.add_argument(
        "--address",
        metavar="ADDR",
        help="with --runners: the Ray cluster to join (e.g. 'auto' or HEAD_IP:6379, see "
        "`ray start --head`); default: the config's ray_address, else the cluster running on "
        "this machine, else a local Ray started for this command and ended after it; with Ray "
        "token authentication, set RAY_AUTH_TOKEN to the head's token (docs/SCALING.md)",
    )
    sample.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between progress lines when stdout is not a terminal (default: 10)",
    )
    add_metrics_out_arguments(sample)


def run_sample(args: argparse.Namespace) -> int:
    """Loads and checks the config (its batch must fit in memory: one sub-env is built here
    to read the agents' spaces), prepares --out and --metrics-out, then samples."""
    config = load_config(args.config, args.overrides)
    check_imports(config)
    check_memory(config)  # before anything is built: num_envs 10,000,000 stops here
    agents, all_agents_act = probe_agents(config, CheckedMapping(config))
    check_memory(config, agents, all_agents_act=all_agents_act)
    if args.episodes is not None:
        unit, target = "episodes", args.episodes
    elif args.steps is not None:
        unit, target = args.count_steps_by, args.steps
    else:
        unit, target = config.count_steps_by, config.num_envs * config.rollout_fragment_length
    num_runners = config.num_runners if args.runners is None else args.runners
    if num_runners > MAX_RUNNERS:
        raise CommandError(f"--runners {num_runners:.3g}: expected at most {MAX_RUNNERS:,}")
    with contextlib.ExitStack() as outputs:
        metrics_log = prepare_outputs(args, config, outputs)
        return _sample(args, config, unit, target, num_runners, metrics_log)


def _sample(
    args: argparse.Namespace,
    config: RunnerConfig,
    unit: str,
    target: int,
    num_runners: int,
    metrics_log: MetricsLogWriter | None,
) -> int:
    try:
        from marl_runner.distributed import EnvRunnerGroup, ray_session  # imports torch
    except ImportError as exc:
        raise CommandError(f"the sampler cannot be loaded: {exc}", EXIT_FAILURE) from exc

    console = Console()
    counts = SampleCounts()
    try:
        with contextlib.ExitStack() as stack:
            group_options: dict[str, Any] = {"policy_mapping_fn": CheckedMapping(config)}
            if num_runners:
                _require_ray()
                # A local Ray is started for the user when no cluster is given; ended after.
                stack.enter_context(ray_session(args.address or config.ray_address))
                group_options["num_cpus_per_runner"] = _cpus_per_runner(num_runners)
            try:
                group = EnvRunnerGroup(config, num_runners, **group_options)
            except Exception as exc:
                raise build_error(exc, config) from exc
            stack.enter_context(group)
            run_metrics = RunMetrics(group.get_metrics, metrics_log)
            progress = make_progress(target, unit, console, interval_s=args.progress_interval)
            try:
                with progress:
                    writer = (
                        None if args.out is None else BatchFileWriter(args.out, args.format, group)
                    )
                    exit_code = _sample_until(
                        group, counts, unit, target, progress, writer, run_metrics
                    )
            finally:
                # Before the group stops: on an error too, the log gets its last record.
                metrics = run_metrics.finish()
    except CommandError:
        raise
    except Exception as exc:
        raise CommandError(describe(exc), EXIT_FAILURE) from exc

    print_run_summary(
        console, metrics, counts, out_dir=args.out, metrics_log=metrics_log,
        interrupted=exit_code != EXIT_OK,
    )
    return exit_code


def _sample_until(
    group: Any,
    counts: SampleCounts,
    unit: str,
    target: int,
    progress: ProgressReporter,
    writer: BatchFileWriter | None,
    run_metrics: RunMetrics,
) -> int:
    """Takes batches from ``group.iter_batches()`` (each one ``EnvRunner.sample()`` of a
    runner) until ``counts.<unit>`` reaches ``target`` or a first Ctrl-C/SIGTERM asks to
    stop, writing each as it arrives and logging metrics when their interval has passed;
    then writes what the group sampled and had not handed out (``group.flush()``), so
    every finished episode is on disk however the run ends (an error too: then the error
    is raised after). Returns the exit code: 0, or
    130/143 when stopped early by Ctrl-C/SIGTERM (a second one stops at once).

    A batch counts once it is written, so after Ctrl-C the summary
    names exactly the batches on disk. The counts' clock (the progress
    display's) starts after the group is built: the steps/s of the progress
    line and of the final table are the same numbers.
    """
    batches = group.iter_batches()
    # The rows since the last fragment are built by _write_rest, under stop.writing().
    with GracefulStop(lambda: group.request_stop(flush=False)) as stop:
        try:
            try:
                for batch in count_batches(
                    batches, counts, unit, target, progress, group.totals, lambda: stop.requested
                ):
                    if writer is not None:
                        with stop.writing(), _said_if_lost(f"batch {counts.batches + 1}"):
                            writer.write(batch, counts.batches + 1)
                    run_metrics.poll()
            except Exception:
                # A crash (a sub-env failing with restarts off, say) raises after the other
                # sub-envs' data is kept: it is written before the error is reported.
                _write_rest_quietly(group, counts, progress, writer, stop)
                raise
            _write_rest(group, counts, progress, writer, stop)
        except KeyboardInterrupt as exc:
            # The second Ctrl-C or SIGTERM (an env that hangs): the episodes finished before
            # it are still written (flush() steps no env).
            _write_rest_quietly(group, counts, progress, writer, stop)
            return exit_code_of(exc)
        finally:
            batches.close()
    return stop.exit_code


def _write_rest_quietly(
    group: Any,
    counts: SampleCounts,
    progress: ProgressReporter,
    writer: BatchFileWriter | None,
    stop: GracefulStop,
) -> None:
    """``_write_rest`` on the way out of a run that failed or was stopped hard: if that
    fails too (another Ctrl-C, say), its warning says so and the way out goes on."""
    with contextlib.suppress(BaseException):
        _write_rest(group, counts, progress, writer, stop)


def _write_rest(
    group: Any,
    counts: SampleCounts,
    progress: ProgressReporter,
    writer: BatchFileWriter | None,
    stop: GracefulStop,
) -> None:
    """The group's rows not yet handed out (``flush()``), written and counted as a batch."""
    with stop.writing(), _said_if_lost("the rows sampled since the last batch"):
        rest = group.flush()
        if rest.agent_steps():
            if writer is not None:
                writer.write(rest, counts.batches + 1)
            count_batch(rest, counts, progress, group.totals)


@contextlib.contextmanager
def _said_if_lost(what: str) -> Iterator[None]:
    """A write (or the build before it) that fails, or is stopped at once by one more
    Ctrl-C, says what it lost, where the summary only counts what was written."""
    try:
        yield
    except BaseException as failed:
        logger.warning("%s not written: %r", what, failed)
        raise


def _require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise CommandError(
            f"--runners needs Ray ({exc}); install it with: pip install 'marl-runner[ray]'",
            EXIT_FAILURE,
        ) from exc


def _cpus_per_runner(num_runners: int) -> float:
    """One CPU per runner, or an equal share when there are more runners than CPUs."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 1.0)
    return min(1.0, cpus / num_runners)
