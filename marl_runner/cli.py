"""The ``marl-runner`` command: ``sample``, ``validate``, ``serve``, ``plot`` and ``bench``.

``serve`` lives in ``marl_runner.serving.cli`` and ``plot`` in
``marl_runner.plot_cli``, both registered here; what the subcommands share
(exit codes, ``CommandError``, config loading, ``--out``, ``--metrics-out``)
is in ``marl_runner.cli_common``.

Exit codes: 0 success; 1 a failure while sampling; 2 a bad command line or
a config that does not validate (including what it names: env, import paths,
mapping, spaces, so anything raised while the runner is built; ``validate``
and ``sample`` agree on it); 130 interrupted. Errors are one line on stderr;
``--traceback`` adds the full trace.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from marl_runner.cli_common import (
    EXIT_BAD_CONFIG,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CheckedMapping,
    CommandError,
    add_metrics_out_arguments,
    build_error,
    check_imports,
    describe,
    load_config,
    non_negative_int,
    open_metrics_log,
    positive_int,
    prepare_out_dir,
)
from marl_runner.config import RunnerConfig
from marl_runner.display import (
    ProgressReporter,
    SampleCounts,
    make_progress,
    metrics_table,
    spaces_table,
)
from marl_runner.imports import ImportPathError, import_object
from marl_runner.io import write_batch
from marl_runner.metrics_log import MetricsLogWriter, RunMetrics
from marl_runner.plot_cli import add_plot_parser, run_plot
from marl_runner.serving.cli import add_serve_parser, run_serve

__all__ = ["build_parser", "main"]

BENCH_ENTRY_POINT = "benchmarks.cli:main"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI and returns its exit code (the console script exits with it)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench":
        return _run_bench(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _import_from_cwd()
    command = {
        "sample": _run_sample,
        "validate": _run_validate,
        "serve": run_serve,
        "plot": run_plot,
    }[args.command]
    try:
        return command(args)
    except CommandError as exc:
        if args.traceback:
            traceback.print_exc()
        print(f"marl-runner {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marl-runner",
        description="Sample multi-agent RL episodes from PettingZoo envs into per-policy batches.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", type=Path, help="YAML run config (see examples/configs/)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config entry; dotted keys reach nested entries and the value is "
        "parsed as YAML, e.g. --set num_envs=8 --set policies.archer.model.hidden=[32,32] "
        "(repeatable)",
    )
    common.add_argument(
        "--traceback",
        action="store_true",
        help="on error, also print the full Python traceback (default: a one-line message)",
    )

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
        help="stop after N episodes have finished (faulty ones not counted); in "
        "truncate_episodes mode the tail of an episode not yet in a full fragment is not written",
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
        help="write each batch as DIR/batch_NNNNNN.npz as soon as it is produced (atomically, "
        "readable with marl_runner.io.read_batches) plus the resolved config as DIR/config.yaml; "
        "DIR must not already hold batch files",
    )
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
        "this machine, else a local Ray started for this command and ended after it",
    )
    sample.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between progress lines when stdout is not a terminal (default: 10)",
    )
    add_metrics_out_arguments(sample)

    commands.add_parser(
        "validate",
        parents=[common],
        help="check a config: build everything sample builds, without stepping, and show "
        "each agent's policy and spaces",
        description="Load the config, import what it names, and build the runner as sample "
        "does (one sub-env in this process): the env, every policy with its connector chains, "
        "the mapping of every possible agent (called as when sampling) and the checks that "
        "agents sharing a policy share spaces that fit it. Rejects exactly what sample rejects "
        "when it starts, with the same exit code (2) and dotted key.",
    )

    add_serve_parser(commands, common)
    add_plot_parser(commands)

    commands.add_parser(
        "bench",
        add_help=False,
        help=f"run the benchmarks (all arguments go to {BENCH_ENTRY_POINT}; "
        "run from the repository root)",
    )
    return parser


# ----------------------------------------------------------------------------- sample


def _run_sample(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    check_imports(config)
    if args.episodes is not None:
        unit, target = "episodes", args.episodes
    elif args.steps is not None:
        unit, target = args.count_steps_by, args.steps
    else:
        unit, target = config.count_steps_by, config.num_envs * config.rollout_fragment_length
    num_runners = config.num_runners if args.runners is None else args.runners
    if args.out is not None:
        prepare_out_dir(args.out, config)
    metrics_log = None
    if args.metrics_out is not None:
        metrics_log = open_metrics_log(args.metrics_out, args.metrics_interval)
    with metrics_log or contextlib.nullcontext():
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
                    interrupted = _sample_until(
                        group, counts, unit, target, progress, args.out, run_metrics
                    )
            finally:
                # Before the group stops: on an error too, the log gets its last record.
                metrics = run_metrics.finish()
    except CommandError:
        raise
    except Exception as exc:
        raise CommandError(describe(exc), EXIT_FAILURE) from exc

    console.print(metrics_table(metrics))
    if args.out is not None:
        console.print(f"wrote {counts.batches} batches to {args.out}", highlight=False)
    if metrics_log is not None:
        console.print(
            f"wrote {metrics_log.num_records} metrics records to {metrics_log.path}",
            highlight=False,
            soft_wrap=True,
        )
    if interrupted:
        console.print("interrupted: the metrics cover what was sampled so far", highlight=False)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _sample_until(
    group: Any,
    counts: SampleCounts,
    unit: str,
    target: int,
    progress: ProgressReporter,
    out_dir: Path | None,
    run_metrics: RunMetrics,
) -> bool:
    """Takes batches from ``group.iter_batches()`` (each one ``EnvRunner.sample()`` of a
    runner) until ``counts.<unit>`` reaches ``target``, writing each as it arrives and
    logging metrics when their interval has passed; returns True when stopped early
    by Ctrl-C.

    A batch counts once ``write_batch`` returned, so after Ctrl-C the summary
    names exactly the batches on disk.
    """
    batches = group.iter_batches()
    try:
        while getattr(counts, unit) < target:
            batch = next(batches)
            if out_dir is not None:
                write_batch(batch, out_dir, counts.batches + 1)
            counts.batches += 1
            counts.env_steps += batch.env_steps()
            counts.agent_steps += batch.agent_steps()
            counts.episodes = group.totals.episodes
            counts.faulty_episodes = group.totals.faulty_episodes
            progress.update(counts)
            run_metrics.poll()
    except KeyboardInterrupt:
        return True
    finally:
        batches.close()
    return False


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


# ----------------------------------------------------------------------------- validate


def _run_validate(args: argparse.Namespace) -> int:
    """Builds everything ``sample`` builds except stepping, so both reject the same configs."""
    config = load_config(args.config, args.overrides)
    check_imports(config)
    try:
        from marl_runner import EnvRunner  # imports torch
    except ImportError as exc:
        raise CommandError(f"the runner cannot be loaded: {exc}", EXIT_FAILURE) from exc
    mapping = _RecordingMapping(config)
    try:
        runner = EnvRunner(_validation_config(config), policy_mapping_fn=mapping)
    except Exception as exc:
        raise build_error(exc, config) from exc
    try:
        rows, unused_policies = _map_agents(runner, mapping.policy_of)
    finally:
        runner.stop()

    console = Console()
    console.print(
        f"env {config.env['name']!r} (api: {config.env['api']}): "
        f"{_plural(len(rows), 'possible agent')}, {_plural(len(config.policies), 'policy', 'policies')}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(spaces_table(rows))
    for policy_id in unused_policies:
        console.print(
            f"note: policy {policy_id!r} has no agent among the env's possible agents",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"config OK: {args.config}", highlight=False, soft_wrap=True)
    return EXIT_OK


class _RecordingMapping(CheckedMapping):
    """The checked mapping that also notes each agent's policy, for the table."""

    def __init__(self, config: RunnerConfig) -> None:
        super().__init__(config)
        self.policy_of: dict[Any, str] = {}

    def __call__(self, agent_id: Any, episode: Any, **kwargs: Any) -> str:
        policy_id = super().__call__(agent_id, episode, **kwargs)
        self.policy_of[agent_id] = policy_id
        return policy_id


def _validation_config(config: RunnerConfig) -> RunnerConfig:
    """One sub-env stepped in this process: builds what sampling builds, at the least cost."""
    vectorize = "external" if config.vectorize == "external" else "sync"
    return dataclasses.replace(config, num_envs=1, vectorize=vectorize, num_workers=None)


def _map_agents(
    runner: Any, policy_of: dict[Any, str]
) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """Table rows (agent, policy, obs space, action space) and the policies no agent maps to.

    The runner mapped every possible agent while building its policies, and
    checked that agents sharing a policy share spaces that fit it.
    """
    env = runner.env
    rows = [
        (
            str(agent),
            policy_of[agent],
            str(env.get_observation_space(agent)),
            str(env.get_action_space(agent)),
        )
        for agent in env.possible_agents
    ]
    used = set(policy_of.values())
    return rows, [pid for pid in runner.config.policies if pid not in used]


# ----------------------------------------------------------------------------- bench


def _run_bench(argv: list[str]) -> int:
    """Forwards everything after ``bench`` to the repo's benchmark CLI."""
    _import_from_cwd()
    try:
        bench_main = import_object(BENCH_ENTRY_POINT)
    except ImportPathError as exc:
        print(
            f"marl-runner bench: error: {exc}; the benchmarks live in the repository's "
            "benchmarks/ folder, so run this from the repository root",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    return int(bench_main(argv) or 0)


# ----------------------------------------------------------------------------- shared


def _import_from_cwd() -> None:
    """Like ``python -m``: import paths such as "examples.mappings:by_prefix" resolve
    against the directory the command runs in (a console script does not add it)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


if __name__ == "__main__":
    sys.exit(main())
