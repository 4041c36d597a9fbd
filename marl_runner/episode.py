"""One sub-env episode: which agents take part, their policies, and their rewards."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marl_runner.trajectories import KeyTable


class AgentSlot:
    """An agent's place in one episode.

    ``key`` indexes the runner's per-trajectory tables; ``pending_reward`` holds
    rewards the env gave while the agent had no obs, credited on its next one.
    """

    __slots__ = ("agent_id", "policy_id", "index", "key", "pending_reward", "done", "reward_total")

    def __init__(self, agent_id: Any, policy_id: str, index: int, key: int) -> None:
        self.agent_id = agent_id
        self.policy_id = policy_id
        self.index = index
        self.key = key
        self.pending_reward = 0.0
        self.done = False
        # Set once the key is released; before that the key table holds the sum.
        self.reward_total: float | None = None


class EpisodeLayout:
    """The agents that observed in the last round, grouped by policy.

    When the next round has exactly the same agents, none done and no stray
    rewards, the runner copies whole groups at once instead of agent by agent.
    """

    __slots__ = ("agent_set", "groups")

    def __init__(self, agent_set: frozenset, groups: list[tuple[Any, tuple, tuple]]) -> None:
        self.agent_set = agent_set
        # (the policy's RoundRows, agent ids, keys) per policy.
        self.groups = groups


class MultiAgentEpisode:
    """Bookkeeping for one episode of one sub-env.

    Rewards are summed per trajectory key by the runner in vectorised form;
    ``agent_rewards`` and ``total_reward`` read those sums on demand.
    """

    def __init__(
        self,
        episode_id: int,
        env_id: int,
        mapping_fn: Callable[..., str],
        key_table: KeyTable,
        validate_policy_id: Callable[[Any, Any], str],
        runner: Any = None,
    ) -> None:
        self.episode_id = episode_id
        self.env_id = env_id
        self.length = 0
        self.custom_metrics: dict[str, float] = {}
        self.hist_data: dict[str, list] = {}
        self.user_data: dict[str, Any] = {}
        self.media: dict[str, Any] = {}
        self.faulty = False
        self.started = False
        self.start_time = time.perf_counter()
        self.slots: dict[Any, AgentSlot] = {}
        self.layout: EpisodeLayout | None = None
        # Rewards for agents not seen yet: they go to the agent's first transition.
        self.rewards_before_first_obs: dict[Any, float] = {}
        # Rewards that no trajectory can carry (a skipped or already handed-out agent).
        self.unassigned_rewards: dict[Any, float] = {}
        self.num_late_rewards = 0
        # Env steps of this episode not yet built into a fragment.
        self.unbuilt_steps = 0
        # Raw obs of the last round each agent observed (only kept for ``fake_obs: last``).
        self.last_raw_obs: dict[Any, Any] = {}
        self._mapping_fn = mapping_fn
        self._key_table = key_table
        self._validate_policy_id = validate_policy_id
        self._policy_cache: dict[Any, str] = {}
        self._runner = runner

    def policy_for(self, agent_id: Any, refresh: bool = False) -> str:
        """The agent's policy id, mapped once per episode unless ``refresh``."""
        if not refresh:
            cached = self._policy_cache.get(agent_id)
            if cached is not None:
                return cached
        policy_id = self._mapping_fn(agent_id, self, runner=self._runner, worker=self._runner)
        policy_id = self._validate_policy_id(agent_id, policy_id)
        self._policy_cache[agent_id] = policy_id
        return policy_id

    def get_agents(self) -> list:
        """Agents that have observed in this episode, in order of appearance."""
        return list(self.slots)

    def agent_index(self, agent_id: Any) -> int:
        return self.slots[agent_id].index

    def is_done(self, agent_id: Any) -> bool:
        slot = self.slots.get(agent_id)
        return slot is not None and slot.done

    def agent_reward(self, slot: AgentSlot) -> float:
        if slot.reward_total is not None:
            return slot.reward_total
        return float(self._key_table.reward_sum[slot.key]) + slot.pending_reward

    @property
    def agent_rewards(self) -> dict[tuple[Any, str], float]:
        """Reward per (agent, policy) so far, including rewards not credited yet."""
        rewards = {(a, s.policy_id): self.agent_reward(s) for a, s in self.slots.items()}
        for agent_id, reward in self.rewards_before_first_obs.items():
            rewards[(agent_id, None)] = rewards.get((agent_id, None), 0.0) + reward
        for agent_id, reward in self.unassigned_rewards.items():
            rewards[(agent_id, None)] = rewards.get((agent_id, None), 0.0) + reward
        return rewards

    @property
    def total_reward(self) -> float:
        return float(sum(self.agent_rewards.values()))

    def __repr__(self) -> str:
        return (
            f"MultiAgentEpisode(id={self.episode_id}, env_id={self.env_id}, "
            f"length={self.length}, agents={len(self.slots)})"
        )
