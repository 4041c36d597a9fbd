"""Exact per-episode reward bookkeeping shared by the scripted envs (here and in tests/envs)."""

from __future__ import annotations

from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict


class RewardLog:
    """`reward_log[k][agent]`: the total reward the env handed `agent` in episode k.

    The last entry is the episode in progress. Tests compare it with what the
    runner put in its batches to check that no reward was lost or doubled.
    """

    reward_log: list[dict[AgentID, float]]

    def _start_reward_episode(self) -> None:
        self.reward_log.append({})

    def _hand_out(self, rewards: MultiAgentDict) -> MultiAgentDict:
        """Record `rewards` in the current episode and return them unchanged."""
        totals = self.reward_log[-1]
        for agent, reward in rewards.items():
            totals[agent] = totals.get(agent, 0.0) + float(reward)
        return rewards
