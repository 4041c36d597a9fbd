"""ScriptedEnv: a MultiAgentEnv that plays a fixed list of rounds.

The edge-case envs (dying, spawning, turn-based ...) are scripts for it, so
each case is written down as data that a test can read next to its checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from marl_runner.bench.envs.reward_log import RewardLog
from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict, MultiAgentEnv, StepResult

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)


@dataclass(frozen=True)
class Round:
    """What the env hands out in one round; round 0 is the reset (no rewards).

    `terminated` / `truncated` name agents whose obs this round is their last
    (they must be in `obs`); `end` ends the episode (`"__all__"`).
    """

    obs: tuple[AgentID, ...] = ()
    rewards: dict[AgentID, float] = field(default_factory=dict)
    terminated: tuple[AgentID, ...] = ()
    truncated: tuple[AgentID, ...] = ()
    end: Literal["terminated", "truncated"] | None = None


class ScriptedEnv(RewardLog, MultiAgentEnv):
    """Plays `script` round by round and checks who acts.

    Each step must carry exactly one action for every agent that got a live
    (not done) obs in the previous round, and each action must fit the
    agent's action space; anything else raises ValueError, so a runner that
    acts for the wrong agents fails loudly. Obs are
    `[round / 100, agent_index / 10, noise]` with noise from the seeded RNG.
    Subclasses change obs, infos or the action check through the three hooks.
    """

    def __init__(
        self,
        script: Sequence[Round],
        agents: Sequence[AgentID],
        observation_space: gym.Space = OBS_SPACE,
        action_space: gym.Space = ACTION_SPACE,
    ) -> None:
        if not script or script[-1].end is None:
            raise ValueError(
                f"{type(self).__name__}: a script must end with a round that sets `end`"
            )
        self.script = list(script)
        self.possible_agents = list(agents)
        self.observation_spaces = dict.fromkeys(self.possible_agents, observation_space)
        self.action_spaces = dict.fromkeys(self.possible_agents, action_space)
        self.reward_log = []
        self._agent_index = {agent: i for i, agent in enumerate(self.possible_agents)}
        self._rng = np.random.default_rng()
        self._round = 0
        self._awaiting_actions: set[AgentID] = set()

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._round = 0
        self._start_reward_episode()
        obs, _, _, _, infos = self._play(self.script[0])
        return obs, infos

    def step(self, actions: MultiAgentDict) -> StepResult:
        name = type(self).__name__
        if self._round + 1 >= len(self.script):
            raise RuntimeError(f"{name} stepped after its episode ended; call reset")
        if set(actions) != self._awaiting_actions:
            raise ValueError(
                f"{name} round {self._round}: expected actions for "
                f"{sorted(self._awaiting_actions)}, got {sorted(actions)}"
            )
        for agent, action in actions.items():
            self._check_action(agent, action)
        self._round += 1
        round_ = self.script[self._round]
        return self._play(round_, self._hand_out(dict(round_.rewards)))

    def _play(self, round_: Round, rewards: MultiAgentDict | None = None) -> StepResult:
        obs = {agent: self._observation(agent) for agent in round_.obs}
        infos = {agent: self._info(agent) for agent in round_.obs}
        terminateds = {agent: agent in round_.terminated for agent in round_.obs}
        truncateds = {agent: agent in round_.truncated for agent in round_.obs}
        terminateds["__all__"] = round_.end == "terminated"
        truncateds["__all__"] = round_.end == "truncated"
        done = {*round_.terminated, *round_.truncated}
        self._awaiting_actions = set() if round_.end else {a for a in round_.obs if a not in done}
        return obs, rewards or {}, terminateds, truncateds, infos

    def _observation(self, agent: AgentID) -> Any:
        """The obs `agent` gets this round."""
        return np.array(
            [self._round / 100, self._agent_index[agent] / 10, self._rng.uniform(-1, 1)],
            np.float32,
        )

    def _info(self, agent: AgentID) -> dict[str, Any]:
        """The info `agent` gets with its obs this round."""
        return {}

    def _check_action(self, agent: AgentID, action: Any) -> None:
        """Raise ValueError unless `action` fits the agent's action space."""
        space = self.get_action_space(agent)
        if not space.contains(action):
            raise ValueError(
                f"{type(self).__name__}: action {action!r} of {agent!r} is not in {space}"
            )


def every_round_script(
    agents: Sequence[AgentID],
    episode_len: int,
    end: Literal["terminated", "truncated"] = "terminated",
) -> list[Round]:
    """All agents observe every round and get `0.1 * (index + 1)` per step."""
    rewards = {agent: 0.1 * (i + 1) for i, agent in enumerate(agents)}
    everyone = tuple(agents)
    last = Round(
        everyone,
        rewards,
        terminated=everyone if end == "terminated" else (),
        truncated=everyone if end == "truncated" else (),
        end=end,
    )
    return [Round(everyone), *(Round(everyone, rewards) for _ in range(episode_len - 1)), last]
