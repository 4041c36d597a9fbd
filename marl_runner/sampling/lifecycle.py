"""An episode's life per sub-env: created, started, stepped, ended or dropped, reset.

Callbacks fire here, each at its event; episode metric records are made
here (after ``on_episode_end``, so custom metrics set there count); and
failures are bounded here: a sub-env whose resets or episodes keep failing
raises instead of looping.
"""

from __future__ import annotations

import logging
import math
import pickle
import traceback
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import numpy as np

from marl_runner.callbacks import Callbacks
from marl_runner.envs import BaseEnv
from marl_runner.envs.errors import EpisodeFault, SubEnvGoneError
from marl_runner.metrics import MetricsCollector, RolloutMetrics
from marl_runner.sampling.env_output import PollResult
from marl_runner.sampling.episode import AgentSlot, MultiAgentEpisode
from marl_runner.sampling.episode_ids import EpisodeIds
from marl_runner.sampling.fragments import FragmentBuilder
from marl_runner.sampling.policy_map import PolicyMap
from marl_runner.sampling.trajectories import KeyTable

_ENV_ID = attrgetter("env_id")
_LENGTH = attrgetter("length")

logger = logging.getLogger(__name__)

#: complete_episodes without max_episode_steps: an episode this long is warned of.
UNLIMITED_EPISODE_WARNING_STEPS = 100_000


class InterruptedStepError(RuntimeError):
    """The step in which a sub-env's episode was running did not finish (the reason is its cause)."""


class NoObservationError(RuntimeError):
    """An episode ended without the env ever observing any agent."""


class SubEnvError(RuntimeError):
    """A sub-env failed and the runner may not go on with it; ``__cause__`` is the original error."""

    def __init__(self, env_id: int, message: str, cause: BaseException | None) -> None:
        self.env_id = env_id
        detail = ""
        if cause is not None:
            detail = "\n" + "".join(traceback.format_exception(cause)).rstrip()
        super().__init__(f"sub-env {env_id}: {message}{detail}")
        self.__cause__ = cause

    def __reduce__(self) -> tuple:
        """Pickled as it reads (a remote runner's error reaches the driver whole); the
        cause goes with it where it pickles (its traceback is in the message anyway)."""
        return _restore_sub_env_error, (type(self), self.env_id, self.args[0], _picklable(self.__cause__))


def _restore_sub_env_error(
    cls: type[SubEnvError], env_id: int, text: str, cause: BaseException | None
) -> SubEnvError:
    error = cls.__new__(cls)
    RuntimeError.__init__(error, text)
    error.env_id, error.__cause__ = env_id, cause
    return error


def _picklable(error: BaseException | None) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return None
    return error


class EpisodeTooLongError(EpisodeFault):
    """An episode of a ``complete_episodes`` run still running after
    ``max_episode_steps`` env steps: dropped (faulty), and its sub-env reset, so that
    an episode that never ends cannot hold sample() (and memory) forever."""


class EpisodeLifecycle:
    """The running episode of each sub-env, and what happens at each of its events."""

    def __init__(
        self,
        env: BaseEnv,
        policy_map: PolicyMap,
        fragments: FragmentBuilder,
        key_table: KeyTable,
        metrics: MetricsCollector,
        perf_stats: Callable[[], dict[str, float]],
        callbacks: Callbacks,
        hooks: frozenset[str],
        hook_context: dict[str, Any],
        config: Any,
    ) -> None:
        self._env = env
        self._policy_map = policy_map
        self._fragments = fragments
        self._keys = key_table
        self._metrics = metrics
        self._perf_stats = perf_stats
        self._callbacks = callbacks
        self._hooks = hooks
        self._hook_context = hook_context
        self._restart = config.restart_failed_sub_environments
        self._max_reset_failures = config.max_consecutive_reset_failures
        self._max_episode_failures = config.max_consecutive_step_failures
        self._max_episode_steps = config.max_episode_steps
        #: Whether polled sub-envs' episodes are cut at max_episode_steps (`cut_overlong`).
        self.cuts_overlong = (
            config.max_episode_steps is not None and config.batch_mode == "complete_episodes"
        )
        # When a running episode is warned of: at max_episode_steps, or, when complete_episodes
        # would wait for it and hold its rows without a limit, at a step count none should
        # reach; else never (inf: one comparison serves every case).
        self._warn_after_steps: float = config.max_episode_steps or (
            UNLIMITED_EPISODE_WARNING_STEPS if config.batch_mode == "complete_episodes" else math.inf
        )
        self._warned_long_episode = False
        self._episode_ids = EpisodeIds()
        # Bound once: every new episode takes them.
        self._map_agent = policy_map.map_agent
        self._live_reward_totals = key_table.live_reward_totals
        self.active: dict[int, MultiAgentEpisode] = {}
        self.awaiting_reset: set[int] = set()
        # Env steps each sub-env made since the runner started: a row's episode env step
        # (``env_t``) is this minus its episode's start, also for an episode that ended in
        # the round its sub-env was reset.
        self._sub_env_steps = np.zeros(config.num_envs, np.int64)
        # Sub-envs whose running episode is kept out of training, or whose episode kept out
        # of training ended in this round (its last rows are not stored either).
        self.untrained_env_ids: set[int] = set()
        self._untrained_ended: list[MultiAgentEpisode] = []
        self._reset_failures: dict[int, int] = {}
        #: Sub-envs that cannot be reset again (restarts off), with the error that said so:
        #: never sent actions again; each step raises that they are gone.
        self.gone: dict[int, SubEnvGoneError] = {}
        self._episode_failures: dict[int, int] = {}

    # ---- events

    def begin_round(self) -> None:
        """Episodes kept out of training that ended in the last round: their trajectory keys
        go only now, after that round's rows were stored (a key freed before could be
        taken by a new episode in the same round), and their sub-env's rows are stored
        again unless its new episode is kept out too."""
        if not self._untrained_ended:
            return
        for episode in self._untrained_ended:
            self._fragments.forget(episode)
            running = self.active.get(episode.env_id)
            if running is None or running.training_enabled:
                self.untrained_env_ids.discard(episode.env_id)
        self._untrained_ended = []

    def episode_for(self, env_id: int) -> MultiAgentEpisode:
        """The sub-env's running episode; its obs start it when it has not started yet."""
        episode = self.active.get(env_id)
        if episode is None:
            episode = self._create(env_id)
        if not episode.started:
            self.awaiting_reset.discard(env_id)
            self._start(episode)
        else:
            self._advance(episode)
        return episode

    def cut_overlong(self, polled: PollResult) -> None:
        """``complete_episodes``: a polled sub-env whose episode has run max_episode_steps
        env steps gets an ``EpisodeTooLongError`` in place of its step's output (the
        episode is dropped as faulty, the sub-env reset, the run goes on)."""
        limit = self._max_episode_steps
        for env_id in list(polled.obs):
            episode = self.active.get(env_id)
            if episode is None or episode.length < limit:
                continue
            polled.obs[env_id] = EpisodeTooLongError(
                f"sub-env {env_id}: its episode has not ended after max_episode_steps={limit} "
                "env steps, and batch_mode complete_episodes hands out whole episodes only: "
                "dropped, and the sub-env reset"
            )
            polled.rewards[env_id], polled.infos[env_id] = {}, {}
            polled.terminateds[env_id] = {"__all__": True}
            polled.truncateds[env_id] = {"__all__": False}

    def env_t(self, env_ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """The episode env step at which each row's obs arrived, for rows of this round
        (``env_ids`` and trajectory ``keys`` per row)."""
        return self._sub_env_steps[env_ids] - self._keys.episode_start_step[keys]

    def advance(self, episodes: list[MultiAgentEpisode]) -> None:
        """One env step more for each of these running episodes (of distinct sub-envs):
        the sub-env step counts in one numpy add, not one scalar add per sub-env."""
        if not episodes:
            return
        self._sub_env_steps[np.fromiter(map(_ENV_ID, episodes), np.int64, len(episodes))] += 1
        for episode in episodes:
            episode.length += 1
        limit = self._warn_after_steps
        # (The longest at C level: this runs every round.)
        if not self._warned_long_episode and max(map(_LENGTH, episodes)) > limit:
            self._warn_long(next(e for e in episodes if e.length > limit))

    def new_slot(self, episode: MultiAgentEpisode, agent_id: Any) -> AgentSlot:
        """A first-time agent's slot: its policy mapped (and built), its trajectory key."""
        episode.claim_name(agent_id)
        policy_id = episode.policy_for(agent_id)
        self._policy_map.entry_for(policy_id, agent_id)
        index = len(episode.slots)
        slot = AgentSlot(agent_id, policy_id, index, self._keys.allocate(episode, index, agent_id))
        episode.slots[agent_id] = slot
        return slot

    def stepped(self, episodes: list[MultiAgentEpisode]) -> None:
        """The ``on_episode_step`` callback for each episode stepped this round."""
        if "on_episode_step" in self._hooks:
            for episode in episodes:
                self._callbacks.on_episode_step(**self._hook_kwargs(episode))

    def end(self, episode: MultiAgentEpisode) -> RolloutMetrics:
        """An episode ended normally: callbacks told, its fragment queued, its metrics record."""
        if not episode.slots:
            raise NoObservationError(
                f"sub-env {episode.env_id}: the episode ended after {episode.length} steps but "
                f"the env never returned an observation for any agent"
            )
        del self.active[episode.env_id]
        self._episode_failures.pop(episode.env_id, None)
        # Before the callback: if it raises, the step's recovery finds the episode among
        # those that ended in the step (`FragmentBuilder.undo_round`) and drops its rows.
        if episode.training_enabled:
            self._fragments.episode_ended(episode)
        else:  # its rows of this round are still to be kept out (`begin_round`)
            self._untrained_ended.append(episode)
        if "on_episode_end" in self._hooks:
            self._callbacks.on_episode_end(**self._hook_kwargs(episode))
        return self._record(episode)

    def drop(self, env_id: int, error: BaseException) -> RolloutMetrics:
        """A faulty episode: no training data from it, one metrics record, callbacks told."""
        logger.warning("sub-env %d failed; dropping its episode: %r", env_id, error)
        episode = self.active.pop(env_id, None) or self._new_episode(env_id)
        episode.faulty = True
        if not any(ended.env_id == env_id for ended in self._untrained_ended):
            self.untrained_env_ids.discard(env_id)
        self._fragments.episode_dropped(episode)
        self._metrics.add_fault(env_id, error)
        if "on_episode_end" in self._hooks:
            self._callbacks.on_episode_end(**self._hook_kwargs(episode), exception=error)
        return self._record(episode)

    def drop_interrupted(self, env_ids: list[int], outputs: list) -> None:
        """Drops the episodes running on ``env_ids`` when a runner step raised (faulty,
        ``InterruptedStepError``), their records into ``outputs``; an ``on_episode_end``
        that raises for one is raised once all are dropped."""
        raised = None
        for env_id in env_ids:
            if env_id not in self.active:
                continue
            error = InterruptedStepError(
                f"sub-env {env_id}: the runner step in which its episode was running raised"
            )
            try:
                outputs.append(self.drop(env_id, error))
            except BaseException as callback_error:  # on_episode_end, after the drop itself
                raised = raised or callback_error
        if raised is not None:
            raise raised

    def recover(self, env_id: int, error: BaseException) -> None:
        """After the sub-env itself failed: restart it, or raise when that is not allowed
        (restarts off) or it keeps failing (``max_consecutive_step_failures`` in a row)."""
        failures = self._episode_failures.get(env_id, 0) + 1
        self._episode_failures[env_id] = failures
        if not self._restart:
            if isinstance(error, SubEnvGoneError):  # its next reset raises, without a try
                self.gone[env_id] = error
            raise SubEnvError(
                env_id, "failed and restart_failed_sub_environments is off; its episode was "
                "dropped, the other sub-envs' data is kept; original error below", error,
            )
        if failures >= self._max_episode_failures:
            raise SubEnvError(
                env_id, f"{failures} episodes in a row failed "
                "(max_consecutive_step_failures); last error below", error,
            )
        self._env.try_restart(env_id)
        self._metrics.num_sub_env_restarts += 1

    def reset(self, env_id: int, outputs: list) -> tuple[MultiAgentEpisode, dict, dict] | None:
        """Resets the sub-env (retrying failed resets); its new episode and reset obs,
        or None when the obs arrive in a later poll."""
        if env_id in self.gone:
            # (Its last reset may have failed in a poll: it is no longer awaited.)
            self.awaiting_reset.discard(env_id)
            raise self._gone_error(env_id)
        while True:
            episode = self._create(env_id)
            try:
                result = self._env.try_reset(env_id)
            except BaseException as error:
                outputs.append(self.drop(env_id, error))  # created, never started
                raise
            if result is None:
                self.awaiting_reset.add(env_id)
                return None
            error = result if isinstance(result, BaseException) else result[0]
            if not isinstance(error, BaseException):
                self._reset_failures.pop(env_id, None)
                self._start(episode)
                return episode, result[0], result[1] or {}
            failures = self._reset_failures.get(env_id, 0) + 1
            self._reset_failures[env_id] = failures
            outputs.append(self.drop(env_id, error))
            if isinstance(error, SubEnvGoneError) and not self._restart:
                # Retrying cannot help, and each try would count another faulty episode.
                self.gone[env_id] = error
                raise self._gone_error(env_id)
            if failures >= self._max_reset_failures:
                raise SubEnvError(
                    env_id, f"failed to reset {failures} times in a row "
                    "(max_consecutive_reset_failures); last error below", error,
                )
            if self._restart:
                self._env.try_restart(env_id)
                self._metrics.num_sub_env_restarts += 1

    # ---- helpers

    def _gone_error(self, env_id: int) -> SubEnvError:
        return SubEnvError(
            env_id, "is gone (its worker process or Ray actor died, or was killed) and "
            "restart_failed_sub_environments is off, so it cannot be reset; build a new runner "
            "or turn restarts on; the other sub-envs' data is kept", self.gone[env_id],
        )

    def _new_episode(self, env_id: int) -> MultiAgentEpisode:
        return MultiAgentEpisode(
            self._episode_ids.next(), env_id, self._map_agent, self._live_reward_totals,
            self._sub_env_steps.item(env_id),
        )

    def _create(self, env_id: int) -> MultiAgentEpisode:
        episode = self.active[env_id] = self._new_episode(env_id)
        if "on_episode_created" in self._hooks:
            self._callbacks.on_episode_created(**self._hook_kwargs(episode))
        return episode

    def _start(self, episode: MultiAgentEpisode) -> None:
        episode.started = True
        if not self._env.training_enabled(episode.env_id):
            episode.training_enabled = False
            self.untrained_env_ids.add(episode.env_id)
        if "on_episode_start" in self._hooks:
            self._callbacks.on_episode_start(**self._hook_kwargs(episode))

    def _advance(self, episode: MultiAgentEpisode) -> None:
        episode.length += 1
        self._sub_env_steps[episode.env_id] += 1
        if episode.length > self._warn_after_steps and not self._warned_long_episode:
            self._warn_long(episode)

    def _warn_long(self, episode: MultiAgentEpisode) -> None:
        """Once per runner: an episode ran past ``_warn_after_steps`` env steps."""
        self._warned_long_episode = True
        limit = int(self._warn_after_steps)
        if self._max_episode_steps is not None:
            logger.warning(
                "sub-env %d: an episode has not ended after max_episode_steps=%d env steps; "
                "does the env ever set terminateds/truncateds['__all__']? (warned once)",
                episode.env_id, limit,
            )
        else:
            logger.warning(
                "sub-env %d: an episode has not ended after %d env steps; batch_mode "
                "complete_episodes holds its rows and sample() waits until it ends: does the "
                "env ever set terminateds/truncateds['__all__']? Set max_episode_steps to drop "
                "such episodes (warned once)", episode.env_id, limit,
            )

    def _record(self, episode: MultiAgentEpisode) -> RolloutMetrics:
        record = RolloutMetrics.of_episode(episode, self._perf_stats())
        self._metrics.add_episode(record, episode.num_late_rewards)
        return record

    def _hook_kwargs(self, episode: MultiAgentEpisode) -> dict[str, Any]:
        return {**self._hook_context, "episode": episode, "env_index": episode.env_id}
