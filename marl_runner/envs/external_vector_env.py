"""`vectorize: external`: the BaseEnv the runner polls for externally driven episodes."""

from __future__ import annotations

import logging
import threading
from typing import Any

import gymnasium as gym

from marl_runner.envs.base_env import BaseEnv, EnvID, PollDicts, put_failure
from marl_runner.envs.errors import EnvError
from marl_runner.envs.external_env import ExternalMultiAgentEnv
from marl_runner.envs.external_episodes import EpisodeBoard
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict

logger = logging.getLogger(__name__)

# How long one poll waits for a client request before returning nothing, so that
# the runner's loop notices stop requests and episode timeouts.
POLL_WAIT_S = 0.05


class ExternalVectorEnv(BaseEnv):
    """Sub-env `i` is slot `i`: whichever external episode currently holds it.

    `poll` returns the slots whose client is waiting for the runner (a
    `get_action`/`log_action` step, or the episode's end), all at once so
    that one forward pass per policy serves them, and the slots whose
    episode went quiet (an `ExternalEpisodeTimeout` obs, ended as faulty).
    Rewards logged between steps ride on the next step. After an episode
    ends, `try_reset` frees its slot and returns None: the next episode that
    takes the slot supplies its first obs in a later poll.

    Args:
        env: the user's `ExternalMultiAgentEnv`; its `run()` starts in a daemon
            thread on the first poll.
        num_envs: how many episodes may run at once.
        episode_timeout_s: `external_episode_timeout_s` (None: no limit).
        batch_wait_s: once a request is ready, wait up to this long for the
            other running episodes' requests (`remote_env_batch_wait_ms`).
    """

    def __init__(
        self,
        env: ExternalMultiAgentEnv,
        num_envs: int,
        episode_timeout_s: float | None = 60.0,
        batch_wait_s: float = 0.0,
    ) -> None:
        if not isinstance(env, ExternalMultiAgentEnv):
            raise EnvError(
                f"vectorize 'external' needs env.name to build an ExternalMultiAgentEnv, got a "
                f"{type(env).__qualname__}; use vectorize 'sync' or 'subprocess' for it"
            )
        if not isinstance(num_envs, int) or num_envs < 1:
            raise EnvError(f"num_envs {num_envs!r}: expected an int >= 1")
        self.num_envs = num_envs
        self.env = env
        self.board = EpisodeBoard(num_envs, episode_timeout_s, batch_wait_s)
        env.attach(self.board)
        self._thread: threading.Thread | None = None
        self._run_error: BaseException | None = None
        self._stopped = False
        self._episodes_stopped = False
        # Set by a poll that began after `stop_episodes` and found nothing left.
        self.drained = False

    def poll(self) -> PollDicts:
        """Every slot's waiting step (one per slot) and every slot whose episode timed out."""
        if self._thread is None:
            self._start_run_thread()
        if self._run_error is not None:
            error, self._run_error = self._run_error, None
            raise EnvError(
                f"{type(self.env).__name__}.run() raised {type(error).__name__}: {error}"
            ) from error
        poll: PollDicts = ({}, {}, {}, {}, {}, {})
        obs, rewards, terminateds, truncateds, infos, off_policy_actions = poll
        stopped_before = self._episodes_stopped
        steps, failures = self.board.take_ready(POLL_WAIT_S)
        self.drained = stopped_before and not steps and not failures
        for env_id, step in steps.items():
            obs[env_id] = step.obs
            rewards[env_id] = step.rewards
            terminateds[env_id] = {"__all__": step.terminated}
            truncateds[env_id] = {"__all__": step.truncated}
            infos[env_id] = step.infos
            off_policy_actions[env_id] = step.off_policy_actions
        for env_id, error in failures.items():
            put_failure(poll, env_id, error)
        return poll

    def send_actions(self, actions: dict[EnvID, MultiAgentDict]) -> None:
        """Answers the waiting `get_action` calls of the slots polled last."""
        for env_id, env_actions in actions.items():
            if not 0 <= env_id < self.num_envs:
                raise EnvError(f"send_actions: env_id {env_id!r} is not in [0, {self.num_envs})")
            self.board.give_actions(env_id, env_actions)

    def try_reset(
        self,
        env_id: EnvID,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """Frees the slot; the next episode that takes it brings its own first obs."""
        self.board.free_slot(env_id)
        return None

    def training_enabled(self, env_id: EnvID) -> bool:
        """Whether the episode in the slot asked for its rows to be kept."""
        return self.board.training_enabled(env_id)

    def try_restart(self, env_id: EnvID) -> None:
        """Nothing to recreate: the next episode on the slot starts afresh."""

    def get_sub_environments(self) -> list[ExternalMultiAgentEnv]:
        """The one user env behind every slot."""
        return [self.env]

    def stop_episodes(self, reason: str) -> None:
        """Refuses client calls from now on (waiting ones too) while the runner goes on.

        The steps already queued (an episode's end among them) still reach
        the runner: step it until `drained` so that every episode ended
        before this call is built, then stop it.
        """
        self._episodes_stopped = True
        self.board.stop(reason)

    def stop(self) -> None:
        """Stops the episodes (waiting clients get `ExternalEnvStopped`) and closes the env."""
        if self._stopped:
            return
        self._stopped = True
        self.board.stop("the runner serving this external env was stopped")
        self.env.close()

    @property
    def possible_agents(self) -> list[AgentID]:
        """The user env's agents: every slot serves the same ones."""
        return list(self.env.possible_agents)

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        """As the user env declares it (what the server checks requests against)."""
        return self.env.get_observation_space(agent)

    def get_action_space(self, agent: AgentID) -> gym.Space:
        """As the user env declares it."""
        return self.env.get_action_space(agent)

    def _start_run_thread(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"{type(self.env).__name__}.run", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self.env.run()
        except BaseException as exc:  # reported by the next poll, with its traceback
            if not self._stopped:
                logger.exception("%s.run() failed", type(self.env).__name__)
                self._run_error = exc
