"""Where every reward of one episode goes: the one home of reward bookkeeping.

An env may reward an agent in a round where the agent has no observation
(turn-based games), before its first observation, or after it is done.
The rule (README, "What it guarantees") is that no reward is lost and each sits on a named transition:

- given with an obs: on the transition that obs closes;
- given without an obs: held, then credited with the agent's next obs (or
  its fake final obs);
- given before the agent's first obs: held, then credited to its first
  transition (the one its second obs closes);
- given after the agent is done: added to its final transition while that
  row has not been handed out in a batch yet, else counted as a late reward.

``totals`` counts everything the env gave, late rewards included; episode
metrics read it. PettingZoo's ``_accumulate_rewards`` is the model: one
idea, one small object.
"""

from __future__ import annotations

from typing import Any


class RewardLedger:
    """The rewards of one episode, per agent."""

    __slots__ = ("totals", "held", "_final_extra", "_handed_out", "num_late_rewards")

    def __init__(self) -> None:
        # Everything the env gave each agent (metrics).
        self.totals: dict[Any, float] = {}
        # Given since the agent's last row; credited with its next row. While it is not
        # empty, a round cannot take the group-wise fast path.
        self.held: dict[Any, float] = {}
        # Given after the agent was done; joins its final transition when built.
        self._final_extra: dict[Any, float] = {}
        # Agents whose final transition is already in a batch.
        self._handed_out: set[Any] = set()
        self.num_late_rewards = 0

    def receive(self, rewards: dict[Any, float]) -> None:
        """Counts one round's rewards in the totals (all of them, whoever gets them)."""
        totals = self.totals
        for agent_id, reward in rewards.items():
            totals[agent_id] = totals.get(agent_id, 0.0) + reward

    def hold(self, agent_id: Any, reward: float) -> None:
        """A reward given while the agent had no obs this round."""
        if reward:
            self.held[agent_id] = self.held.get(agent_id, 0.0) + reward

    def credit(self, agent_id: Any, reward: float) -> float:
        """The reward to put on the agent's row this round: held rewards plus ``reward``."""
        held = self.held.pop(agent_id, None)
        return reward if held is None else held + reward

    def forfeit(self, agent_id: Any) -> None:
        """The agent never gets a row (first seen already done): nothing to credit."""
        self.held.pop(agent_id, None)

    def give_after_done(self, agent_id: Any, reward: float) -> None:
        """A reward for an agent that is already done (already counted in ``totals``)."""
        if not reward:
            return
        if agent_id in self._handed_out:
            self.num_late_rewards += 1
        else:
            self._final_extra[agent_id] = self._final_extra.get(agent_id, 0.0) + reward

    def hand_out_final(self, agent_id: Any) -> float:
        """The agent's final transition is being built: the extra reward it carries."""
        self._handed_out.add(agent_id)
        return self._final_extra.pop(agent_id, 0.0)
