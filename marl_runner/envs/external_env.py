"""`ExternalMultiAgentEnv`: an env that drives its own episodes and asks for actions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from marl_runner.envs.errors import EnvError
from marl_runner.envs.external_episodes import EpisodeBoard
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv


class ExternalMultiAgentEnv(MultiAgentEnv):
    """Inverted control: a simulator, game server or robot runs the episodes itself.

    Subclass it and write `run()`, which plays episodes (from one thread or
    many) with the five calls below; the runner (`vectorize: external`)
    starts `run()` in a daemon thread on its first poll and answers
    `get_action` with the same agent connectors, batched forward pass and
    action connectors as for any vector env. `num_envs` is the number of
    episodes that may run at once. For HTTP serving, `run()` may return at
    once (the default): the HTTP clients make the calls.

    Every call is thread-safe. `obs`, `rewards` and `actions` are dicts keyed
    by agent id. An unknown or finished `episode_id` raises `ValueError`
    naming it; once the runner stopped, calls raise `ExternalEnvStopped`.
    """

    def __init__(
        self,
        observation_spaces: dict[AgentID, gym.Space],
        action_spaces: dict[AgentID, gym.Space],
    ) -> None:
        if not isinstance(observation_spaces, dict) or not isinstance(action_spaces, dict):
            raise EnvError(
                f"{type(self).__name__}: observation_spaces and action_spaces must be dicts "
                f"agent_id -> gym.Space, got {type(observation_spaces).__name__} and "
                f"{type(action_spaces).__name__}"
            )
        if observation_spaces.keys() != action_spaces.keys():
            raise EnvError(
                f"{type(self).__name__}: observation_spaces has agents {list(observation_spaces)} "
                f"but action_spaces has {list(action_spaces)}; expected the same agents"
            )
        self.possible_agents = list(observation_spaces)
        self.observation_spaces = dict(observation_spaces)
        self.action_spaces = dict(action_spaces)
        self._board: EpisodeBoard | None = None

    def run(self) -> None:
        """Play episodes with the calls below; runs in a daemon thread. Default: nothing."""

    # ------------------------------------------------------------------ the five calls

    def start_episode(self, episode_id: Any = None, training_enabled: bool = True) -> Any:
        """Open an episode (waiting for a free slot); returns its id (a new one when None).

        With `training_enabled=False` the episode is served but its data is
        not used for training.
        """
        return self._attached().start_episode(episode_id, training_enabled)

    def get_action(self, episode_id: Any, obs: MultiAgentDict) -> MultiAgentDict:
        """Actions of the agents in `obs`, from the policies; blocks until the runner answers.

        Rewards logged since the last step are credited to each agent's
        previous action.
        """
        return self._attached().get_action(episode_id, obs)

    def log_action(self, episode_id: Any, obs: MultiAgentDict, actions: MultiAgentDict) -> None:
        """Record actions the env chose itself for the agents in `obs` (off-policy).

        Does not wait for the runner; the trajectory stores these actions, each with
        its log-prob under the policy (`action_logp`). An action outside its agent's
        action space is refused (`ValueError`).
        """
        if isinstance(actions, dict):
            for agent, action in actions.items():
                space = self.get_action_space(agent)
                if not _contains(space, action):
                    raise ValueError(
                        f"log_action({episode_id!r}): agent {agent!r}'s action {action!r} is "
                        f"not in its action space {space}"
                    )
        self._attached().log_action(episode_id, obs, actions)

    def log_returns(
        self, episode_id: Any, rewards: MultiAgentDict, infos: MultiAgentDict | None = None
    ) -> None:
        """Add rewards (and infos for the next obs) for the agents' last actions."""
        self._attached().log_returns(episode_id, rewards, infos)

    def end_episode(self, episode_id: Any, obs: MultiAgentDict, truncated: bool = False) -> None:
        """End the episode with its final obs (agents without one get a fake final obs).

        `truncated=True` marks a time limit rather than a terminal state.
        """
        self._attached().end_episode(episode_id, obs, truncated)

    # ------------------------------------------------------------------ plumbing

    def attach(self, board: EpisodeBoard) -> None:
        """Connect to the vector env that serves this env (done by `ExternalVectorEnv`)."""
        if self._board is not None and self._board is not board:
            raise EnvError(f"{type(self).__name__} is already served by another vector env")
        self._board = board

    def _attached(self) -> EpisodeBoard:
        if self._board is None:
            raise EnvError(
                f"{type(self).__name__} is not served yet: build an EnvRunner with "
                "`vectorize: external` whose env.name names this class"
            )
        return self._board

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Refused: the simulator starts its own episodes (`start_episode`)."""
        raise EnvError(
            f"{type(self).__name__} drives its own episodes; use it with `vectorize: external`"
        )

    def step(self, actions: MultiAgentDict) -> Any:
        """Refused: the simulator steps itself and asks for actions (`get_action`)."""
        raise EnvError(
            f"{type(self).__name__} drives its own episodes; use it with `vectorize: external`"
        )


def _contains(space: gym.Space, value: Any) -> bool:
    """``space.contains(value)``, False where the space's check itself fails on it."""
    try:
        return bool(space.contains(value))
    except Exception:
        return False
