"""Scripted envs for the agent-lifecycle edge cases a runner must get right.

Each docstring says which rule of the sampling loop (docs/DESIGN.md) the script exercises; rewards are
chosen so that losing or doubling any one of them changes the totals.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from marl_runner.bench.envs.scripted_env import Round, ScriptedEnv
from marl_runner.envs.multi_agent_env import MultiAgentEnv


class DyingAgentsEnv(ScriptedEnv):
    """Four agents that end at different rounds (9 rounds, terminated).

    a0 terminates at round 3 and a1 at round 6 (final obs with terminated
    True); a2 lives to the end; a3 observes only on even rounds, so the
    episode ends (round 9) while it has no obs: it needs a fake final obs.
    Every live agent gets `0.1 * (index + 1)` per round, with obs or not.
    """

    AGENTS = ("a0", "a1", "a2", "a3")
    LAST_ROUND = {"a0": 3, "a1": 6}
    EPISODE_LEN = 9

    def __init__(self) -> None:
        script = [Round(self.AGENTS)]
        for round_index in range(1, self.EPISODE_LEN + 1):
            alive = [
                a for a in self.AGENTS if self.LAST_ROUND.get(a, self.EPISODE_LEN) >= round_index
            ]
            observing = tuple(a for a in alive if a != "a3" or round_index % 2 == 0)
            rewards = {a: 0.1 * (self.AGENTS.index(a) + 1) for a in alive}
            if round_index == self.EPISODE_LEN:
                script.append(Round(observing, rewards, terminated=observing, end="terminated"))
            else:
                dying = tuple(a for a in observing if self.LAST_ROUND.get(a) == round_index)
                script.append(Round(observing, rewards, terminated=dying))
        super().__init__(script, self.AGENTS)


class SpawningAgentsEnv(ScriptedEnv):
    """Agents that appear mid-episode (8 rounds, truncated by a time limit).

    a1 first observes at round 2 but is rewarded at round 1 already (that
    reward belongs to its first transition); a2 appears at round 3 already
    terminated (it is skipped, so it is never rewarded); a3 appears at round
    5; a1 terminates at round 6.
    """

    AGENTS = ("a0", "a1", "a2", "a3")

    def __init__(self) -> None:
        script = [
            Round(("a0",)),
            Round(("a0",), {"a0": 1.0, "a1": 0.5}),
            Round(("a0", "a1"), {"a0": 1.0}),
            Round(("a0", "a1", "a2"), {"a0": 1.0, "a1": 1.0}, terminated=("a2",)),
            Round(("a0", "a1"), {"a0": 1.0, "a1": 1.0}),
            Round(("a0", "a1", "a3"), {"a0": 1.0, "a1": 1.0}),
            Round(("a0", "a1", "a3"), {"a0": 1.0, "a1": 1.0, "a3": 1.0}, terminated=("a1",)),
            Round(("a0", "a3"), {"a0": 1.0, "a3": 1.0}),
            Round(("a0", "a3"), {"a0": 1.0, "a3": 1.0}, truncated=("a0", "a3"), end="truncated"),
        ]
        super().__init__(script, self.AGENTS)


class TurnBasedEnv(ScriptedEnv):
    """Three players taking turns (7 rounds, terminated); one obs per round.

    Rewards go to players without an obs that round (p0 at round 2), before
    a player's first obs (p2 at round 1), and after a player is done (p1
    terminates at round 4 and is rewarded at round 5). At round 4 p1's final
    obs and p2's turn arrive together, as an AEC wrapper delivers them. The
    episode ends on p0's turn, so p2 ends without an obs.
    """

    AGENTS = ("p0", "p1", "p2")

    def __init__(self) -> None:
        script = [
            Round(("p0",)),
            Round(("p1",), {"p0": 1.0, "p2": 0.5}),
            Round(("p2",), {"p1": 1.0, "p0": -0.25}),
            Round(("p0",), {"p2": 1.0}),
            Round(("p1", "p2"), {"p0": 1.0, "p1": 3.0}, terminated=("p1",)),
            Round(("p0",), {"p2": 1.0, "p1": 2.0}),
            Round(("p2",), {"p0": 1.0}),
            Round(("p0",), {"p2": 1.0, "p0": 0.5}, terminated=("p0",), end="terminated"),
        ]
        super().__init__(script, self.AGENTS)


class TimeLimitEnv(ScriptedEnv):
    """An episode cut by a time limit after 5 rounds (`"__all__"` truncated).

    a0 observes every round and ends truncated; a1 observes only on even
    rounds, so it has no obs in the last round: its fake final obs must be
    marked truncated, not terminated, to keep value bootstrapping right.
    """

    AGENTS = ("a0", "a1")

    def __init__(self) -> None:
        rewards = {"a0": 1.0, "a1": 0.5}
        script = [
            Round(("a0", "a1")),
            Round(("a0",), rewards),
            Round(("a0", "a1"), rewards),
            Round(("a0",), rewards),
            Round(("a0", "a1"), rewards),
            Round(("a0",), rewards, truncated=("a0",), end="truncated"),
        ]
        super().__init__(script, self.AGENTS)


class NoObsEnv(ScriptedEnv):
    """An episode of 2 rounds in which no agent ever gets an obs.

    A runner must report it as an error saying the env never returned an
    observation for any agent (and must step it with empty action dicts).
    """

    def __init__(self) -> None:
        super().__init__([Round(), Round(), Round(end="terminated")], ("a0",))


class RewardedBeforeAndAfterEnv(ScriptedEnv):
    """b is rewarded `0.5 * k` in rounds 1-6 but observes only in rounds 2-4 (6 rounds).

    b's rewards of rounds 1-2 (before and with its first obs) belong to its
    first transition, round 3's too (3.0 on the row round 3 closes); round 4
    ends b (terminated), so the rewards of rounds 5-6 arrive after it is done
    and join its final transition (2.0 + 2.5 + 3.0 = 7.5). a observes every
    round and gets 1.0 per round. Rounds 2 and 3 have the same agents, which
    is when a runner copies whole groups at once.
    """

    AGENTS = ("a", "b")

    def __init__(self) -> None:
        script = [Round(("a",))]
        for k in range(1, 7):
            observing = ("a", "b") if 2 <= k <= 4 else ("a",)
            script.append(
                Round(
                    observing,
                    {"a": 1.0, "b": 0.5 * k},
                    terminated=("b",) if k == 4 else ("a",) if k == 6 else (),
                    end="terminated" if k == 6 else None,
                )
            )
        super().__init__(script, self.AGENTS)


class ReusedArraysEnv(MultiAgentEnv):
    """Writes every obs into the same array per agent (as fast envs do) and returns the
    same info dict per agent, updated in place: obs ``[t, agent index]``, episodes of
    ``length`` rounds, truncated. Each episode's final obs (``t == length``) must reach
    the batch, not the next episode's reset obs written over it."""

    possible_agents = ["a0", "a1"]
    observation_spaces = dict.fromkeys(
        possible_agents, gym.spaces.Box(0.0, 100.0, (2,), np.float32)
    )
    action_spaces = dict.fromkeys(possible_agents, gym.spaces.Discrete(2))

    def __init__(self, length: int = 4) -> None:
        self.length, self.t = length, 0
        self._obs = {agent: np.zeros(2, np.float32) for agent in self.possible_agents}
        self._infos: dict = {agent: {} for agent in self.possible_agents}

    def _output(self) -> tuple[dict, dict]:
        for index, agent in enumerate(self.possible_agents):
            self._obs[agent][:] = (self.t, index)
            self._infos[agent]["t"] = self.t
        return dict(self._obs), dict(self._infos)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        return self._output()

    def step(self, actions: dict) -> tuple:
        self.t += 1
        obs, infos = self._output()
        over = self.t == self.length
        return obs, dict.fromkeys(actions, 1.0), {"__all__": False}, {"__all__": over}, infos


class ReturningAgentEnv(MultiAgentEnv):
    """a1 terminates at step 2 and has obs (and rewards) again from step 4: a respawn
    under the same id, which the runner does not take (an agent is done for the rest of
    its episode). Every agent with an obs gets 1.0 a step; 6 steps, truncated; actions
    are not checked."""

    possible_agents = ["a0", "a1"]
    observation_spaces = dict.fromkeys(
        possible_agents, gym.spaces.Box(0.0, 100.0, (1,), np.float32)
    )
    action_spaces = dict.fromkeys(possible_agents, gym.spaces.Discrete(2))

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        return self._obs(self.possible_agents), {}

    def _obs(self, agents: list) -> dict:
        return {agent: np.array([self.t], np.float32) for agent in agents}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        agents = ["a0"] if self.t == 3 else self.possible_agents
        terminateds = {"__all__": False, "a1": self.t == 2}
        truncateds = {"__all__": self.t == 6}
        return self._obs(agents), dict.fromkeys(agents, 1.0), terminateds, truncateds, {}


class NeverEndingOnEvenSeedsEnv(MultiAgentEnv):
    """One agent; a sub-env first seeded with an even seed never ends its episodes, the
    others end them (terminated) after ``episode_len`` steps. Reward 1.0 a step."""

    possible_agents = ["a0"]
    observation_spaces = {"a0": gym.spaces.Box(0.0, 1e9, (1,), np.float32)}
    action_spaces = {"a0": gym.spaces.Discrete(2)}

    def __init__(self, episode_len: int = 5) -> None:
        self.episode_len, self.never_ends, self.t = episode_len, None, 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        if self.never_ends is None:
            self.never_ends = seed is not None and seed % 2 == 0
        self.t = 0
        return {"a0": np.array([0.0], np.float32)}, {}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        over = not self.never_ends and self.t == self.episode_len
        obs = {"a0": np.array([self.t], np.float32)}
        return obs, {"a0": 1.0}, {"__all__": over, "a0": over}, {"__all__": False}, {}


class AgentIdsEnv(MultiAgentEnv):
    """Agents with the given ids (``agent_ids``; ``spawn_last``: the last one appears
    from step 2 on), each observing ``[t]`` and rewarded 1.0 a step; 4 steps, truncated."""

    observation_spaces: dict = {}
    action_spaces: dict = {}

    def __init__(self, agent_ids: list, spawn_last: bool = False) -> None:
        self.possible_agents = list(agent_ids)
        self.observation_spaces = dict.fromkeys(
            agent_ids, gym.spaces.Box(0.0, 100.0, (1,), np.float32)
        )
        self.action_spaces = dict.fromkeys(agent_ids, gym.spaces.Discrete(2))
        self.spawn_last, self.t = spawn_last, 0

    def _agents(self) -> list:
        late = self.spawn_last and self.t < 2
        return self.possible_agents[:-1] if late else self.possible_agents

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        return {agent: np.array([0.0], np.float32) for agent in self._agents()}, {}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        agents = self._agents()
        obs = {agent: np.array([self.t], np.float32) for agent in agents}
        return obs, dict.fromkeys(agents, 1.0), {"__all__": False}, {"__all__": self.t == 4}, {}
