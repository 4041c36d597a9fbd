"""`marl-runner serve CONFIG`: a policy server for `vectorize: external` configs.

Runs the config's runner behind `PolicyServer` until SIGINT/SIGTERM (or an
optional `--steps`/`--episodes` target), writes every batch to `--out` as
`sample` does (its own and those uploaded by local-inference clients), logs
metrics to `--metrics-out` as `sample` does, shows the same progress line, and
prints the metrics table on shutdown.

The runner builds one batch per finished episode (`batch_mode` is set to
`complete_episodes`), so a finished episode is never held back waiting for a
fragment to fill up, and an abandoned one never leaves partial rows. However
it stops (a signal or the target), `serve` refuses new client calls (503),
lets the runner take every step already queued (episodes whose
`end_episode` was answered get built), closes the endpoint, writes the
uploads received, and only then prints the last progress line and the table,
both from the same counts of what was written. Exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from marl_runner.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    BatchFileWriter,
    CommandError,
    add_metrics_out_arguments,
    add_out_format_argument,
    check_imports,
    check_memory,
    describe,
    freeze_startup_objects,
    load_config,
    positive_int,
    prepare_outputs,
)
from marl_runner.cli.display import (
    ProgressReporter,
    SampleCounts,
    counted,
    make_progress,
    print_run_summary,
)
from marl_runner.config import RunnerConfig
from marl_runner.metrics_log import MetricsLogWriter, RunMetrics
from marl_runner.serving.batches import num_episodes

DEFAULT_PORT = 9900
TOKEN_ENV_VAR = "MARL_RUNNER_TOKEN"


def add_serve_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Registers `serve` on the CLI's subparsers (`common`: config, --set, --traceback)."""
    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve the config's policies over HTTP to external simulators (vectorize: external)",
        description="Run the config's runner behind an HTTP policy server: clients "
        "(marl_runner.client.PolicyClient, or any HTTP client speaking JSON) start episodes, "
        "ask for actions and log rewards; batches go to --out as with sample. Stops on "
        "SIGINT/SIGTERM (exit 0) or when --steps/--episodes is reached.",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; any other needs a token)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to bind (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    serve.add_argument(
        "--token",
        default=None,
        help=f"shared token clients must send (default: ${TOKEN_ENV_VAR}); "
        "required when --host is not a loopback address; a request without it gets 401 "
        "before its body is read (never '100 Continue')",
    )
    serve.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write each batch (one per finished episode, atomically, in --format) plus "
        "DIR/config.yaml",
    )
    add_out_format_argument(serve)
    target = serve.add_mutually_exclusive_group()
    target.add_argument(
        "--steps",
        type=positive_int,
        metavar="N",
        help="stop after N env steps in the batches (default: serve until stopped)",
    )
    target.add_argument(
        "--episodes",
        type=positive_int,
        metavar="N",
        help="stop after N episodes (default: serve until stopped)",
    )
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="largest request body accepted (default 64 MB; bigger: 413)",
    )
    serve.add_argument(
        "--max-workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="requests handled at once, those waiting for actions included (default: the "
        "larger of 64 and 2 x num_envs + 16); one more gets 503 with Retry-After. Connections "
        "cost no thread: an event loop serves them all",
    )
    serve.add_argument(
        "--idle-timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="close a connection with no complete request for this long (default 5): idle "
        "keep-alive connections, and a request line and headers that take longer (a client "
        "dripping them); PolicyClient reconnects by itself",
    )
    serve.add_argument(
        "--request-timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="head start of a request body and of an answer on --min-body-rate (default 10); "
        "a body that takes longer gets 408 and the connection closes, an answer left unread "
        "closes it, so slow clients never hold the server",
    )
    serve.add_argument(
        "--min-body-rate",
        type=_positive_kib,
        default=None,
        metavar="KIB_PER_S",
        help="slowest rate, in KiB/s, at which a body must arrive and an answer be read, "
        "after the --request-timeout head start (default 64)",
    )
    serve.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="serve local inference from N processes on one port (default 1): N - 1 more "
        "decode and check uploads, this one writes --out and merges filter statistics. "
        "Remote-inference calls then get 501: an episode's connector state lives in one runner",
    )
    serve.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between progress lines (default: 10)",
    )
    add_metrics_out_arguments(serve)


def run_serve(args: argparse.Namespace) -> int:
    """The `serve` command: serves until stopped or the target is reached; returns the exit code."""
    from marl_runner.serving.server import is_loopback

    config = load_config(args.config, args.overrides)
    check_imports(config)
    if config.vectorize != "external":
        raise CommandError(
            f"serve needs `vectorize: external` (env.name an ExternalMultiAgentEnv subclass), "
            f"got vectorize {config.vectorize!r}"
        )
    console = Console()
    # A client that goes quiet must cost its episode, never the server; and every
    # finished episode is a batch at once, so stopping never holds one back.
    config = dataclasses.replace(
        config, restart_failed_sub_environments=True, batch_mode="complete_episodes"
    )
    check_memory(config)  # the episode slots' rows, as sample and validate count them
    token = args.token or os.environ.get(TOKEN_ENV_VAR) or None
    if not token and not is_loopback(args.host):
        raise CommandError(
            f"--host {args.host} is not a loopback address: give a shared token with --token "
            f"or ${TOKEN_ENV_VAR}"
        )
    with contextlib.ExitStack() as outputs:
        metrics_log = prepare_outputs(args, config, outputs)
        return _serve(args, config, token, console, metrics_log)


def _serve(
    args: argparse.Namespace,
    config: RunnerConfig,
    token: str | None,
    console: Console,
    metrics_log: MetricsLogWriter | None,
) -> int:
    from marl_runner.sampling.runner import EnvRunner  # imports torch: only when serving
    from marl_runner.serving.server import PolicyServer, ServerSetupError, listening_socket
    from marl_runner.serving.workers import start_workers

    counts = SampleCounts()
    stop = threading.Event()
    unit, target = _target(args)
    progress = (
        make_progress(target, unit, console, interval_s=args.progress_interval)
        if target is not None
        else _ServeLines(console, args.progress_interval)
    )
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with EnvRunner(config) as runner:
            run_metrics = RunMetrics(runner.get_metrics, metrics_log)
            files = None if args.out is None else BatchFileWriter(args.out, args.format, runner)
            writer = _Writer(counts, progress, files, stop, unit, target, run_metrics)
            settings = {"max_body_bytes": int(args.max_body_mb * 1024 * 1024), **_capacity(args)}
            several = args.workers > 1
            try:
                server = PolicyServer(
                    runner, args.host, args.port, token=token, local_only=several,
                    sock=listening_socket(args.host, args.port, reuse_port=several), **settings,
                )
            except (ServerSetupError, OSError) as exc:
                raise CommandError(f"cannot serve on {args.host}:{args.port}: {exc}") from exc
            workers: list = []
            try:
                try:
                    server.start()
                    if several:
                        workers = start_workers(args.workers - 1, server, config.to_dict(),
                                                token, settings)
                    freeze_startup_objects()
                    how = (f"{args.workers} processes, local inference only" if several
                           else f"{config.num_envs} episodes at once")
                    console.print(
                        f"serving {config.env['name']} on {server.address} ({how})",
                        highlight=False,
                        soft_wrap=True,
                    )
                    console.file.flush()
                    with progress:
                        try:
                            server.serve(stop, writer)
                        finally:
                            _stop_serving(runner, server, writer, workers)
                finally:  # failed before serving (a closed stdout): nothing else closes it
                    if not server.closing:
                        server.close()
            finally:  # on an error too, the log gets its last record
                metrics = _written_metrics(run_metrics.finish(), writer)
            uploaded = server.num_uploaded
    except CommandError:
        raise
    except Exception as exc:
        raise CommandError(describe(exc), EXIT_FAILURE) from exc
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _print_summary(console, metrics, counts, args.out, metrics_log, uploaded)
    return EXIT_OK


def _print_summary(
    console: Console,
    metrics: dict[str, Any],
    counts: SampleCounts,
    out_dir: Path | None,
    metrics_log: MetricsLogWriter | None,
    uploaded: int,
) -> None:
    """The serving metrics table, then what was written where, as `sample` prints it."""
    uploads = [f"{counted(uploaded, 'batch', 'batches')} came from local-inference clients"]
    print_run_summary(
        console, metrics, counts, out_dir=out_dir, metrics_log=metrics_log,
        notes=uploads if uploaded else (), title="serving metrics",
    )


def _stop_serving(runner: Any, server: Any, writer: _Writer, workers: list) -> None:
    """Everything a client was told is done gets written: queued steps, then uploads.

    New client calls get 503 from the first line on, so the runner's queue
    only shrinks; the loop ends at the first poll that finds it empty.
    Workers close first: the uploads they answered 200 are queued here by then.
    """
    from marl_runner.serving.workers import stop_workers

    runner.env.stop_episodes("the server is stopping")
    try:
        while not runner.env.drained:
            for item in runner.step():
                writer(item)
    finally:
        stop_workers(workers)
        server.close()  # no new requests; the uploads already answered are queued
        runner.stop()
        try:
            server.drain_uploads(writer)
        finally:
            writer.close()  # every batch handed over is on disk


def _written_metrics(metrics: dict[str, Any], writer: _Writer) -> dict[str, Any]:
    """The runner's metrics with the counts, rates and means of what was written.

    The runner alone misses the local-inference clients' episodes and counts
    steps of abandoned and evaluation episodes; the table must show what
    `--out` holds, as the progress line does.
    """
    counts = writer.counts
    episodes = counts.episodes
    return {
        **metrics,
        "episodes": episodes,
        "num_env_steps": counts.env_steps,
        "num_agent_steps": counts.agent_steps,
        "episode_reward_mean": writer.reward_sum / episodes if episodes else None,
        "episode_len_mean": counts.env_steps / episodes if episodes else None,
        "policy_reward_mean": {
            pid: total / writer.policy_episodes[pid]
            for pid, total in writer.policy_rewards.items()
            if writer.policy_episodes[pid]
        },
    }


def _positive(unit: str, scale: float = 1.0) -> Callable[[str], float]:
    """An argparse type: a finite number of `unit` > 0, returned times `scale`.

    Zero would make sockets non-blocking (seconds) or divide by zero (rates).
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of {unit} > 0, got {text!r}"
            ) from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number of {unit} > 0, got {text}")
        return value * scale

    return parse


_positive_seconds = _positive("seconds")
_positive_kib = _positive("KiB/s", scale=1024)  # returned in bytes/s


def _capacity(args: argparse.Namespace) -> dict[str, Any]:
    """The `PolicyServer` capacity arguments given on the command line (others: its defaults)."""
    given = {
        "max_concurrency": args.max_workers,
        "idle_timeout_s": args.idle_timeout,
        "request_timeout_s": args.request_timeout,
        "min_body_rate": args.min_body_rate,
    }
    return {name: value for name, value in given.items() if value is not None}


def _target(args: argparse.Namespace) -> tuple[str, int | None]:
    if args.episodes is not None:
        return "episodes", args.episodes
    return "env_steps", args.steps


class _Writer:
    """Counts and writes every runner output; sets `stop` once the target is reached.

    Episodes are counted from the batches written (one per finished
    episode, uploads included), faulty ones from the runner's records, so
    the progress line, the `--episodes` target and the final table all
    count what `--out` holds (`close()` waits for the files still queued).
    """

    def __init__(
        self,
        counts: SampleCounts,
        progress: ProgressReporter,
        files: BatchFileWriter | None,
        stop: threading.Event,
        unit: str,
        target: int | None,
        run_metrics: RunMetrics,
    ) -> None:
        from marl_runner.batch import MultiAgentBatch
        from marl_runner.metrics import RolloutMetrics

        self._batch_type, self._metrics_type = MultiAgentBatch, RolloutMetrics
        self.counts, self.progress = counts, progress
        self.files = None if files is None else _FilesInBackground(files)
        self.stop, self.unit, self.target = stop, unit, target
        self.run_metrics = run_metrics
        self.reward_sum = 0.0
        self.policy_rewards: dict[str, float] = {}
        self.policy_episodes: dict[str, int] = {}

    def __call__(self, item: Any) -> None:
        """Writes a batch (or counts a faulty episode's record) and updates the progress."""
        counts = self.counts
        if isinstance(item, self._batch_type):
            if self.files is not None:
                self.files.write(item, counts.batches + 1)
            episodes = num_episodes(item)
            counts.add(item)
            counts.episodes += episodes
            self._add_rewards(item)
            self.run_metrics.poll()
        elif isinstance(item, self._metrics_type) and item.episode_faulty:
            counts.faulty_episodes += 1
        else:
            return  # a finished episode's record: counted with its batch
        self.progress.update(counts)
        if self.target is not None and getattr(counts, self.unit) >= self.target:
            self.stop.set()

    def close(self) -> None:
        """Waits until every batch handed over is written; raises a write's error."""
        if self.files is not None:
            self.files.close()

    def _add_rewards(self, batch: Any) -> None:
        """Reward sums for the table's means (numeric columns only: uploads are checked
        by the server, but a summary must never be what stops it)."""
        for pid, policy_batch in batch.policy_batches.items():
            rewards = policy_batch.get("rewards")
            if rewards is None or not np.issubdtype(rewards.dtype, np.number):
                continue
            reward = float(np.sum(rewards, dtype=np.float64))
            self.reward_sum += reward
            self.policy_rewards[pid] = self.policy_rewards.get(pid, 0.0) + reward
            eps_ids = policy_batch.get("eps_id")
            episodes = 0 if eps_ids is None else len(np.unique(eps_ids))
            self.policy_episodes[pid] = self.policy_episodes.get(pid, 0) + episodes


class _FilesInBackground:
    """`BatchFileWriter.write` on a thread of its own, in order, so that the sampling loop
    runs the next forward pass while a file is written and fsynced (a stall of a millisecond
    or more for every waiting client otherwise). Parquet batches are written at the call:
    their metadata is read from the runner, which only the sampling loop may touch.

    The first error is raised by the next `write` (or `close`); nothing is written after it.
    """

    def __init__(self, files: BatchFileWriter) -> None:
        self._files = files
        self._queue: queue.Queue = queue.Queue(maxsize=64)  # a slow disk holds the loop back
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="batch-files", daemon=True)
        self._thread.start()

    def write(self, batch: Any, index: int) -> None:
        if self._error is not None:
            raise self._error
        if self._files.file_format == "parquet":
            self._files.write(batch, index)
        else:
            self._queue.put((batch, index))

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._files.write(*item)
                except BaseException as exc:
                    self._error = exc


class _ServeLines(ProgressReporter):
    """Progress without a target: one line every `interval_s` seconds, and a last one.

    Its rate is the counts' own (steps written over the serving time up to
    the last count), the same number the final table shows.
    """

    def __init__(self, console: Console, interval_s: float) -> None:
        super().__init__(1, "env_steps", console)
        self.interval_s = interval_s
        self._last = -float("inf")
        self._counts: SampleCounts | None = None
        self._last_line = ""

    def __exit__(self, *exc_info: object) -> None:
        if self._counts is not None and self._line(self._counts) != self._last_line:
            self._print(self._counts)

    def _show(self, counts: SampleCounts) -> None:
        """Prints a line when `interval_s` has passed since the last one; keeps the counts."""
        self._counts = counts
        if time.perf_counter() - self._last >= self.interval_s:
            self._print(counts)

    def _print(self, counts: SampleCounts) -> None:
        line = self._last_line = self._line(counts)
        self.console.file.write(line + "\n")
        self.console.file.flush()
        self._last = time.perf_counter()

    @staticmethod
    def _line(counts: SampleCounts) -> str:
        faulty = f" ({counts.faulty_episodes} faulty)" if counts.faulty_episodes else ""
        return (
            f"serving: {counted(counts.env_steps, 'env step')}, "
            f"{counted(counts.episodes, 'episode')}{faulty}, "
            f"{counts.env_steps_per_s():,.0f} env steps/s, {counts.elapsed_s:.1f}s elapsed"
        )
