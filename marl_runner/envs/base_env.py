"""The vector-env protocol the runner drives: N multi-agent sub-envs by env_id."""

from __future__ import annotations

import abc
import logging
import threading
from typing import Any

import gymnasium as gym

from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv

logger = logging.getLogger(__name__)

EnvID = int
MultiEnvDict = dict[EnvID, Any]
#: What ``BaseEnv.poll`` returns: six dicts by position (obs, rewards, terminateds,
#: truncateds, infos, off-policy actions), each ``env_id -> agent_id -> value``; the
#: runner reads them by name as a ``marl_runner.sampling.env_output.PollResult``.
PollDicts = tuple[
    MultiEnvDict, MultiEnvDict, MultiEnvDict, MultiEnvDict, MultiEnvDict, MultiEnvDict
]


class BaseEnv(abc.ABC):
    """N sub-envs, each a MultiAgentEnv, addressed by an integer `env_id`.

    Every dict handed out is keyed `env_id -> agent_id -> value`. A failing
    sub-env never raises out of `poll`: its `obs` entry is the Exception and
    `terminateds[env_id]["__all__"]` is True, so the runner can drop the
    episode and carry on. Malformed env output (a contract breach, not a
    crash) raises `EnvError`.
    """

    num_envs: int

    @abc.abstractmethod
    def poll(self) -> PollDicts:
        """`(obs, rewards, terminateds, truncateds, infos, off_policy_actions)`
        of the sub-envs that have data ready; the first poll returns every
        sub-env's reset obs (empty rewards, `"__all__"` flags False)."""

    def poll_blocks(self) -> PollDicts:
        """``poll()``, except that sub-envs whose results arrived as one
        ``step_block.StepBlock`` may have a ``BlockRow`` as their obs entry and no entry
        in the other five dicts (``step_block.materialize`` makes them dicts). The runner
        polls this way; a vector env whose results are arrays anyway overrides it."""
        return self.poll()

    @abc.abstractmethod
    def send_actions(self, actions: dict[EnvID, MultiAgentDict]) -> None:
        """Hand each listed sub-env its actions (an empty dict still steps it)."""

    @abc.abstractmethod
    def try_reset(
        self,
        env_id: EnvID,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict] | None:
        """Reset one sub-env after its episode ended.

        Returns `(obs, infos)` now, or None when the reset obs will arrive in
        a later poll. When the reset raised, `obs` is that Exception and
        `infos` is empty (the same convention as `poll`); the runner counts it
        as a faulty episode and tries again, up to `max_consecutive_reset_failures`
        times. A `SubEnvGoneError` there (its process or actor is gone) is not
        tried again while restarts are off.
        """

    def try_restart(self, env_id: EnvID) -> None:
        """Recreate a sub-env (e.g. after it crashed); reset it afterwards."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart sub-envs")

    def training_enabled(self, env_id: EnvID) -> bool:
        """Whether the episode now starting on `env_id` produces training data (else it
        is played, and counted in the metrics, but none of its rows reach a batch)."""
        return True

    def try_render(self, env_id: EnvID | None = None) -> Any:
        """Render one sub-env (default: the first)."""
        return None

    def get_sub_environments(self) -> list[Any]:
        """The sub-env objects, where they live in this process (else empty)."""
        return []

    @abc.abstractmethod
    def stop(self) -> None:
        """Close every sub-env and release workers; safe to call twice."""

    @property
    @abc.abstractmethod
    def possible_agents(self) -> list[AgentID]:
        """The agents a probe sub-env knows up front (may miss spawned ones)."""

    @abc.abstractmethod
    def get_observation_space(self, agent: AgentID) -> gym.Space:
        """Observation space of `agent`, asked from a probe sub-env."""

    @abc.abstractmethod
    def get_action_space(self, agent: AgentID) -> gym.Space:
        """Action space of `agent`, asked from a probe sub-env."""

    def __enter__(self) -> BaseEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class ResetSeeds:
    """Which seed each sub-env's next reset gets.

    Sub-env i's first reset gets `seed + i`; later resets are unseeded, so a
    run is reproducible from `seed`. A sub-env recreated after a crash is
    seeded afresh (`seed + i + generation * num_envs`), keeping the run
    reproducible across restarts. With `seed=None` nothing is seeded.
    """

    def __init__(self, seed: int | None, num_envs: int) -> None:
        self.seed = seed
        self.num_envs = num_envs
        self._generations = [0] * num_envs
        self._fresh = [True] * num_envs

    def for_reset(self, env_id: EnvID, seed: int | None = None) -> int | None:
        """The seed for resetting `env_id` now; an explicit `seed` wins."""
        if seed is None and self._fresh[env_id] and self.seed is not None:
            seed = self.seed + env_id + self._generations[env_id] * self.num_envs
        self._fresh[env_id] = False
        return seed

    def recreated(self, env_id: EnvID) -> None:
        """Note that `env_id` is a new env object whose first reset gets a seed."""
        self._generations[env_id] += 1
        self._fresh[env_id] = True


def put_reset(
    poll: PollDicts, env_id: EnvID, obs: MultiAgentDict | Exception, infos: MultiAgentDict
) -> None:
    """Enter a sub-env's reset obs into a poll result (a failed reset ends it at once)."""
    poll[0][env_id] = obs
    poll[1][env_id] = {}
    poll[2][env_id] = {"__all__": isinstance(obs, Exception)}
    poll[3][env_id] = {"__all__": False}
    poll[4][env_id] = infos
    poll[5][env_id] = {}


def put_failure(poll: PollDicts, env_id: EnvID, error: Exception) -> None:
    """Enter a crashed sub-env into a poll result: its obs is the Exception."""
    put_reset(poll, env_id, error, {})


def close_quietly(env: MultiAgentEnv, env_id: EnvID) -> None:
    """Close a sub-env that may be broken: a failing close is logged, so that
    it never stops a restart or a shutdown."""
    try:
        env.close()
    except Exception:
        logger.warning("closing sub-env %d failed", env_id, exc_info=True)


def close_within(env: MultiAgentEnv, timeout_s: float, what: str) -> None:
    """Close ``env`` (``what`` names it) in a thread given ``timeout_s``: a close that
    hangs is left running (logged), so that a shutdown of a process backend, whose
    workers are bounded, is bounded too."""
    closing = threading.Thread(
        target=close_quietly, args=(env, 0), name="marl-runner-close", daemon=True
    )
    closing.start()
    closing.join(timeout_s)
    if closing.is_alive():
        logger.warning("%s did not close within %g s; left closing", what, timeout_s)
