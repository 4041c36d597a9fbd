"""The dict-based multi-agent env API every marl_runner env speaks."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from marl_runner.envs.errors import EnvError

AgentID = Any
MultiAgentDict = dict[AgentID, Any]
StepResult = tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]


class MultiAgentEnv:
    """Base class of a multi-agent env with per-agent dicts.

    Only agents that are to act (or that end) this round appear in `obs`.
    `terminateds` and `truncateds` also carry the key `"__all__"`, which is
    true exactly in the round that ends the episode; `rewards` may name
    agents without an obs this round (the runner keeps those rewards for the
    agent's next transition). The runner treats the dicts a step returns as
    read-only, so envs may hand out objects they keep reusing.

    Subclasses set `possible_agents`, `observation_spaces` and `action_spaces`
    (dicts keyed by agent) and override `reset` and `step`. Envs whose agents
    are not all known up front override `get_observation_space` /
    `get_action_space` so that they answer for agents spawned later.
    """

    possible_agents: list[AgentID]
    observation_spaces: dict[AgentID, gym.Space]
    action_spaces: dict[AgentID, gym.Space]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Start a new episode; returns `(obs, infos)` of the agents to act first."""
        raise NotImplementedError

    def step(self, actions: MultiAgentDict) -> StepResult:
        """Apply one action per agent that got a live obs last round.

        An empty dict is valid: it plays a round in which no agent had to act
        (e.g. all that observed were done). Returns
        `(obs, rewards, terminateds, truncateds, infos)`.
        """
        raise NotImplementedError

    def get_observation_space(self, agent: AgentID) -> gym.Space:
        """The observation space of `agent`, also for agents spawned mid-episode."""
        try:
            return self.observation_spaces[agent]
        except KeyError:
            raise EnvError(
                f"{type(self).__name__} has no observation space for agent {agent!r}; "
                f"expected one of {list(self.observation_spaces)}"
            ) from None

    def get_action_space(self, agent: AgentID) -> gym.Space:
        """The action space of `agent`, also for agents spawned mid-episode."""
        try:
            return self.action_spaces[agent]
        except KeyError:
            raise EnvError(
                f"{type(self).__name__} has no action space for agent {agent!r}; "
                f"expected one of {list(self.action_spaces)}"
            ) from None

    def render(self) -> Any:
        """Render the current state, if the env supports it (default: nothing)."""
        return None

    def close(self) -> None:
        """Release windows, processes and other resources (default: nothing)."""
