"""Evaluating a checkpoint: whole episodes with its policies, nothing learned, rewards summarised.

``evaluate_checkpoint`` restores the checkpoint under the trust rules of
``restore_checkpoint`` (import paths from the file need ``trusted`` or
``allow``), freezes the connectors (observation filters stop updating), runs
``episodes`` complete episodes and reports per policy the mean and standard
deviation of its episode reward (the rewards of its agents summed, as in
``get_metrics()["policy_reward_mean"]``) and the mean episode length.

By default the runner steps one sub-env, so exactly the first ``episodes``
episodes after the seed are measured, in order; ``--set num_envs=8`` is
faster but then episodes that end first are the ones counted (every episode
finished by then is kept, so at least ``episodes``). Optionally the first
episode of sub-env 0 is rendered (``render_mode="rgb_array"``) and saved as an
animated GIF.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from connectors.imports import import_object
from marl_runner.callbacks import Callbacks
from marl_runner.config import RunnerConfig
from marl_runner.envs.errors import EnvError
from marl_runner.io.batch_checks import shortened
from marl_runner.metrics import RolloutMetrics

__all__ = [
    "DEFAULT_MAX_EPISODE_STEPS",
    "EpisodeResult",
    "EpisodeTooLong",
    "Evaluation",
    "EvaluationError",
    "evaluate_checkpoint",
]

#: At most this many frames go into a GIF (a KAZ frame is 2.7 MB before quantising).
DEFAULT_MAX_FRAMES = 500
#: Env steps an evaluated episode may run: the file's env config sets episode lengths
#: (``max_cycles: 1e9`` would never end). Atari's longest, 108,000 frames at frameskip 4,
#: is 27,000 steps.
DEFAULT_MAX_EPISODE_STEPS = 100_000


class EvaluationError(Exception):
    """A checkpoint that cannot be evaluated as asked (e.g. ``render`` on an env that cannot)."""


class EpisodeTooLong(EvaluationError):
    """An episode did not end within ``max_episode_steps`` env steps; evaluation stopped."""

    def __init__(self, path: Any, limit: int, env: Any) -> None:
        self.path, self.limit, self.env = path, limit, env
        super().__init__(self._message("max_episode_steps=", "max_episode_steps"))

    def cli_message(self) -> str:
        """The same, naming the command-line flags."""
        return self._message("--max-episode-steps ", "--max-episode-steps")

    def _message(self, given: str, raise_it: str) -> str:
        return (
            f"{self.path}: an episode did not end within {self.limit:,} env steps "
            f"({given}{self.limit}); the checkpoint's env config decides how long episodes are: "
            f"{shortened(self.env)}. Raise {raise_it}, or shorten episodes with an override "
            "of env.config"
        )


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    """One finished episode: its reward (all agents), length and reward per policy."""

    reward: float
    length: int
    policy_rewards: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Every evaluated episode, and how they were run."""

    checkpoint: str
    seed: int | None
    deterministic: bool
    episodes: list[EpisodeResult]
    faulty_episodes: int
    frames: int = 0  # written to the GIF

    def summary(self) -> dict[str, Any]:
        """JSON-ready: overall and per-policy mean/std reward, mean length, the raw episodes."""
        rewards = [e.reward for e in self.episodes]
        per_policy: dict[str, list[float]] = defaultdict(list)
        for episode in self.episodes:
            for policy_id, reward in episode.policy_rewards.items():
                per_policy[policy_id].append(reward)
        return {
            "checkpoint": self.checkpoint,
            "seed": self.seed,
            "deterministic": self.deterministic,
            "episodes": len(self.episodes),
            "faulty_episodes": self.faulty_episodes,
            "episode_reward_mean": _mean(rewards),
            "episode_reward_std": _std(rewards),
            "episode_len_mean": _mean([e.length for e in self.episodes]),
            "policies": {
                policy_id: {
                    "episodes": len(values),
                    "reward_mean": _mean(values),
                    "reward_std": _std(values),
                }
                for policy_id, values in sorted(per_policy.items())
            },
            "episode_rewards": rewards,
            "episode_lengths": [e.length for e in self.episodes],
        }


def evaluate_checkpoint(
    path: str | os.PathLike[str],
    *,
    episodes: int,
    seed: int | None = None,
    deterministic: bool = False,
    overrides: Sequence[str] = (),
    trusted: bool = False,
    allow: Iterable[str] = (),
    render_to: str | os.PathLike[str] | None = None,
    fps: float = 10.0,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS,
) -> Evaluation:
    """Runs ``episodes`` whole episodes with the checkpoint's policies and records them.

    ``seed`` replaces the config's seed; ``deterministic`` takes the most
    likely action (``explore: false``); ``overrides`` are ``--set`` style
    config overrides. ``render_to`` writes the first episode of sub-env 0 as
    an animated GIF (``fps`` frames per second, at most ``max_frames``).
    An episode that does not end within ``max_episode_steps`` env steps stops the
    evaluation (``EpisodeTooLong``): episode lengths come from the file's env config.

    Raises:
        CheckpointError: the file is unreadable, or names import paths not opted into.
        EvaluationError: bad arguments, an env that cannot be rendered, or a
            config that drives no env (``vectorize: external``).
    """
    from marl_runner.checkpoint import checkpoint_config, restore_checkpoint  # imports torch

    if not isinstance(episodes, int) or episodes < 1:
        raise EvaluationError(f"episodes: got {episodes!r}, expected an integer >= 1")
    if not (isinstance(fps, int | float) and math.isfinite(fps) and fps > 0):
        raise EvaluationError(f"fps: got {fps!r}, expected a number > 0")
    if (
        isinstance(max_episode_steps, bool)
        or not isinstance(max_episode_steps, int)
        or (max_episode_steps < 1)
    ):
        raise EvaluationError(
            f"max_episode_steps: got {max_episode_steps!r}, expected an integer >= 1"
        )
    allow = list(allow)
    ours = [f"seed={seed}"] if seed is not None else []
    ours += ["explore=false"] if deterministic else []
    ours += ["env.config.render_mode=rgb_array"] if render_to is not None else []
    config = checkpoint_config(
        path,
        trusted=trusted,
        allow=allow,
        # One sub-env, so at most one worker (a file's num_workers: 2 failed as more than it).
        overrides=[
            "batch_mode=complete_episodes", "num_envs=1", "num_workers=null", *overrides, *ours
        ],
    )
    if config.vectorize == "external":
        raise EvaluationError(
            f"{path}: the checkpoint's config serves external simulators (vectorize: external), "
            "so there is no env to step; give one with --set vectorize=sync --set env.name=..."
        )
    recorder = _recorder_class(config)(
        max_frames if render_to is not None else 0, max_episode_steps
    )
    try:
        runner = restore_checkpoint(
            path, config=config, trusted=trusted, allow=allow, callbacks=recorder
        )
    except EnvError as err:
        if render_to is None:
            raise
        raise EvaluationError(
            f"--render: env {config.env['name']!r} cannot be built with "
            f"render_mode='rgb_array': {err}"
        ) from err
    with runner:
        for entry in runner.policy_map.entries.values():  # no learning: filters stay frozen
            entry.agent_pipeline.in_eval()
            entry.action_pipeline.in_eval()
        try:
            runner.sample(num_episodes=episodes)
        except _EpisodeTooLong:
            raise EpisodeTooLong(path, max_episode_steps, config.env) from None
    if recorder.render_error is not None:
        raise EvaluationError(recorder.render_error)
    if render_to is not None:
        _write_gif(recorder.frames, Path(render_to), fps)
    return Evaluation(
        checkpoint=str(path),
        seed=config.seed,
        deterministic=not config.explore,
        episodes=recorder.results,
        faulty_episodes=recorder.faulty,
        frames=len(recorder.frames),
    )


class _EpisodeTooLong(Exception):
    """Raised from the recorder's step hook; ends ``sample()`` and becomes ``EpisodeTooLong``."""


class _Recorder:
    """Callbacks mixin: a result per finished episode, the first episode's frames, and the
    episode step cap."""

    def __init__(self, max_frames: int, max_episode_steps: int) -> None:
        super().__init__()
        self.max_episode_steps = max_episode_steps
        self.results: list[EpisodeResult] = []
        self.faulty = 0
        self.frames: list[Any] = []
        self.max_frames = max_frames
        self.render_error: str | None = None
        self._rendered_episode: Any = None

    def on_episode_start(self, **kwargs: Any) -> None:
        super().on_episode_start(**kwargs)  # type: ignore[misc]
        if self.max_frames and self._rendered_episode is None and kwargs["env_index"] == 0:
            self._rendered_episode = kwargs["episode"]
            self._grab(kwargs["base_env"])

    def on_episode_step(self, **kwargs: Any) -> None:
        super().on_episode_step(**kwargs)  # type: ignore[misc]
        if kwargs["episode"].length > self.max_episode_steps:
            raise _EpisodeTooLong
        if kwargs["episode"] is self._rendered_episode and len(self.frames) < self.max_frames:
            self._grab(kwargs["base_env"])

    def on_episode_end(self, **kwargs: Any) -> None:
        super().on_episode_end(**kwargs)  # type: ignore[misc]
        if kwargs["episode"] is self._rendered_episode:
            self.max_frames = 0  # one episode only
        record = RolloutMetrics.of_episode(kwargs["episode"])
        if record.episode_faulty:
            self.faulty += 1
            return
        per_policy: dict[str, float] = defaultdict(float)
        for (_agent, policy_id), reward in record.agent_rewards.items():
            if policy_id is not None:
                per_policy[policy_id] += float(reward)
        self.results.append(
            EpisodeResult(record.episode_reward, record.episode_length, dict(per_policy))
        )

    def _grab(self, base_env: Any) -> None:
        if self.render_error is not None:
            return
        frame = base_env.try_render(0)
        if not (
            isinstance(frame, np.ndarray)
            and frame.dtype == np.uint8
            and frame.ndim == 3
            and frame.shape[2] in (3, 4)
        ):
            kind = (
                f"an array {frame.dtype} {frame.shape}"
                if isinstance(frame, np.ndarray)
                else (f"{type(frame).__name__} {frame!r:.60}")
            )
            self.render_error = (
                f"--render: the env's render() returned {kind}; expected an rgb_array frame "
                "(height, width, 3) of uint8, from an env that supports render_mode='rgb_array'"
            )
            self.max_frames = 0
            return
        from PIL import Image  # only when rendering

        self.frames.append(Image.fromarray(frame[:, :, :3]).quantize(colors=256))


def _recorder_class(config: RunnerConfig) -> type:
    """The recorder on top of the config's callbacks class, so its hooks still run.

    Only called with a config that passed the checkpoint's trust checks.
    """
    base = import_object(config.callbacks) if config.callbacks else Callbacks
    return type("EvaluationRecorder", (_Recorder, base), {})


def _write_gif(frames: list[Any], path: Path, fps: float) -> None:
    if not frames:
        raise EvaluationError("--render: no frame was rendered")
    path.parent.mkdir(parents=True, exist_ok=True)
    frames[0].save(
        path,
        save_all=True,
        append_images=frames[1:],
        duration=max(1, round(1000 / fps)),
        loop=0,
    )


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _std(values: Sequence[float]) -> float:
    return float(np.std(values)) if len(values) else math.nan
