"""TensorBoard logging as a ``Callbacks`` object: sampling metrics as scalars after each sample.

TensorBoard is optional (``pip install 'marl-runner[tensorboard]'``); it is
imported when a ``TensorBoardCallbacks`` is built, never by ``import
marl_runner``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from marl_runner.callbacks import Callbacks
from marl_runner.metrics import MetricsCollector, RolloutMetrics
from marl_runner.metrics_log import is_finite_number

__all__ = ["TensorBoardCallbacks"]

#: Numbers of a ``get_metrics()`` summary written as one scalar each, under their own name.
SCALAR_KEYS = (
    "episodes",
    "num_faulty_episodes",
    "num_late_rewards",
    "episode_reward_mean",
    "episode_reward_min",
    "episode_reward_max",
    "episode_len_mean",
    "num_env_steps",
    "num_agent_steps",
    "env_steps_per_s",
    "agent_steps_per_s",
)
#: Dicts of a summary written as one scalar per entry, tagged ``key/entry``.
NESTED_KEYS = ("policy_reward_mean", "custom_metrics")
STEP_UNITS = ("env_steps", "agent_steps")


class TensorBoardCallbacks(Callbacks):
    """Writes what ``get_metrics()`` reports to TensorBoard after every ``sample()``.

    The values are computed from the episodes that ended and the batch that
    ``sample()`` returned, not by calling ``runner.get_metrics()``, since that
    resets the counters that the caller (a training loop, ``marl-runner
    sample``, an ``EnvRunnerGroup``) reads. Each scalar's step is the
    cumulative count of ``step_by`` in the batches sampled so far.

    To combine with your own hooks, subclass it and call ``super()`` at the
    end of ``on_episode_end`` (so the custom metrics you set there are
    logged) and in ``on_sample_end``. Use it in one process: a copy pickled
    to another process starts its own event file.

    Args:
        log_dir: where the event files go; None: ``runs/<time>_<host>`` (as
            ``torch.utils.tensorboard.SummaryWriter``), which also lets a config
            name this class in ``callbacks:``.
        step_by: ``"env_steps"`` or ``"agent_steps"``, the scalars' x axis.
        flush_secs: how often the writer flushes on its own; each
            ``on_sample_end`` flushes too.

    Raises:
        ImportError: TensorBoard is not installed.
        ValueError: ``step_by`` is not one of the two units.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        step_by: str = "env_steps",
        flush_secs: float = 30.0,
    ) -> None:
        if step_by not in STEP_UNITS:
            raise ValueError(
                f"TensorBoardCallbacks step_by {step_by!r}: expected one of {STEP_UNITS}"
            )
        summary_writer_class()  # a missing install fails here, not at the first sample
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.step_by = step_by
        self.flush_secs = flush_secs
        self.env_steps = 0
        self.agent_steps = 0
        self._collector = MetricsCollector()
        self._writer: Any = None

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        """Notes the episode as the runner's metrics do (faulty ones count, without rewards)."""
        record = RolloutMetrics.of_episode(episode)
        self._collector.add_episode(record, episode.num_late_rewards)

    def on_sample_end(self, *, samples: Any, **kwargs: Any) -> None:
        """Writes the metrics of this sample (its episodes and steps) and flushes."""
        env_steps, agent_steps = samples.env_steps(), samples.agent_steps()
        self.env_steps += env_steps
        self.agent_steps += agent_steps
        self._collector.num_env_steps = env_steps
        self._collector.num_agent_steps = agent_steps
        metrics = self._collector.summary(perf={}, connector_metrics={})
        writer = self.writer
        step = self.env_steps if self.step_by == "env_steps" else self.agent_steps
        for tag, value in scalars(metrics):
            writer.add_scalar(tag, value, global_step=step)
        writer.flush()

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``, opened on first use (log your own scalars with it too)."""
        if self._writer is None:
            self._writer = summary_writer_class()(log_dir=self.log_dir, flush_secs=self.flush_secs)
            self.log_dir = self._writer.log_dir
        return self._writer

    def close(self) -> None:
        """Flushes and closes the event file; a later sample opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> TensorBoardCallbacks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """A pickled copy (e.g. sent to a Ray actor) opens its own writer."""
        return {**self.__dict__, "_writer": None}


def scalars(metrics: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` for every finite number of a ``get_metrics()`` summary that
    TensorBoard shows: SCALAR_KEYS by name, NESTED_KEYS entries as ``key/entry``."""
    for key in SCALAR_KEYS:
        if is_finite_number(metrics.get(key)):
            yield key, float(metrics[key])
    for key in NESTED_KEYS:
        for name, value in (metrics.get(key) or {}).items():
            if is_finite_number(value):
                yield f"{key}/{name}", float(value)


def summary_writer_class() -> type:
    """``torch.utils.tensorboard.SummaryWriter``, or an ImportError that says what to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(
            f"TensorBoard logging needs the tensorboard package ({exc}); "
            "install it with: pip install 'marl-runner[tensorboard]'"
        ) from exc
    return SummaryWriter

