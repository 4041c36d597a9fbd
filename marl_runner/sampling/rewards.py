"""Where every reward of one episode goes: the one home of reward crediting.

An env may reward an agent in a round where the agent has no observation
(turn-based games), before its first observation, or after it is done.
The rule (README, "What it guarantees") is that no reward is lost and each sits on a named transition:

- given with an obs: on the transition that obs closes;
- given without an obs: held, then credited with the agent's next obs (or
  its fake final obs);
- given before the agent's first obs, or with it: held, then credited to its
  first transition (the one its second obs closes);
- given to an agent first seen already done: it never gets a row; counted only;
- given after the agent is done: added to its final transition while that
  row has not been handed out in a batch yet, else counted as a late reward.

Totals count everything the env gave, late rewards included; episode
metrics read them (``totals_with``). Rewards of fast-path rows are counted per
trajectory key in bulk (``count_rewards_on_rows``) and banked here when the
key is released; all others are counted here as they arrive (``receive``).
The round collector asks the ledger what each row carries (``fast_path_ok``
and ``rewards_on_rows``, or ``settle``); the trajectory store asks it what a
final transition carries (``add_rewards_after_done``). Nothing else decides
about rewards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np


class _Slot(Protocol):
    done: bool


class RewardLedger:
    """The rewards of one episode, per agent."""

    __slots__ = ("counted", "held", "_final_extra", "_handed_out", "num_late_rewards")

    def __init__(self) -> None:
        # What the env gave each agent outside fast-path rows, plus banked key totals.
        self.counted: dict[Any, float] = {}
        # Given since the agent's last row; credited with its next row.
        self.held: dict[Any, float] = {}
        # Given after the agent was done; joins its final transition when built.
        self._final_extra: dict[Any, float] = {}
        # Agents whose final transition is already in a batch.
        self._handed_out: set[Any] = set()
        self.num_late_rewards = 0

    def receive(self, rewards: Mapping[Any, float]) -> None:
        """Counts one general-path round's rewards (all of them, whoever gets them)."""
        counted = self.counted
        for agent_id, reward in rewards.items():
            counted[agent_id] = counted.get(agent_id, 0.0) + reward

    def bank(self, agent_id: Any, total: float) -> None:
        """A released trajectory key's fast-path total joins the agent's count."""
        if total:
            self.counted[agent_id] = self.counted.get(agent_id, 0.0) + total

    def totals_with(self, live: Mapping[Any, float]) -> dict[Any, float]:
        """Everything the env gave each agent: counted here, plus ``live`` (the fast-path
        totals of the episode's keys not released yet)."""
        totals = dict(self.counted)
        for agent_id, total in live.items():
            totals[agent_id] = totals.get(agent_id, 0.0) + total
        return totals

    # ---- the rows of a round

    def fast_path_ok(self, rewards: Mapping[Any, float], observing: frozenset) -> bool:
        """Whether each row can carry just its own reward: nothing is held and every
        nonzero reward goes to an agent in ``observing`` (a turn-based env hands the
        others 0.0); else the round needs ``settle``."""
        if self.held:
            return False
        # Most rounds: every reward is someone's own, or all are zero (C-level checks).
        if rewards.keys() <= observing or not any(rewards.values()):
            return True
        return not any(reward for agent_id, reward in rewards.items() if agent_id not in observing)

    @staticmethod
    def rewards_on_rows(
        rewards: Sequence[Mapping[Any, float]],
        agent_ids: Sequence[Any],
        rows_of: Callable[[Sequence[Mapping[Any, float]]], Iterable[float]],
    ) -> list[float]:
        """The fast path's row rewards for one policy group of several sub-envs (one
        rewards dict each): every row carries its own agent's reward (``rows_of``
        reads them all in C), 0.0 for an agent given none."""
        try:
            return list(rows_of(rewards))
        except KeyError:
            return [given.get(agent_id, 0.0) for given in rewards for agent_id in agent_ids]

    def settle(
        self,
        rewards: Mapping[Any, float],
        rows: Sequence[tuple[Any, bool]],
        slots: Mapping[Any, _Slot],
        born_done: Iterable[Any],
    ) -> list[float]:
        """The reward on each row of one sub-env's round, and the fate of every other reward.

        ``rows``: ``(agent_id, is_first)`` per row (real or fake final obs);
        ``slots``: the episode's agents as they were before this round (``done``);
        ``born_done``: agents first seen already done, which get no row.
        """
        held = self.held
        if not rewards and not held:
            # Nothing given, nothing held (every reset round): each row carries 0.0.
            return [0.0] * len(rows)
        for agent_id in born_done:
            held.pop(agent_id, None)
        with_row = {agent_id for agent_id, _ in rows}
        skipped = set(born_done)
        for agent_id, reward in rewards.items():
            if agent_id in with_row or agent_id in skipped:
                continue
            slot = slots.get(agent_id)
            if slot is not None and slot.done:
                self._after_done(agent_id, reward)
            elif reward:
                held[agent_id] = held.get(agent_id, 0.0) + reward
        row_rewards = []
        for agent_id, is_first in rows:
            reward = rewards.get(agent_id, 0.0)
            if is_first:
                # A first row closes nothing; what it was given waits for the next row.
                if reward:
                    held[agent_id] = held.get(agent_id, 0.0) + reward
                row_rewards.append(0.0)
            else:
                earlier = held.pop(agent_id, None)
                row_rewards.append(reward if earlier is None else earlier + reward)
        return row_rewards

    def _after_done(self, agent_id: Any, reward: float) -> None:
        """A reward for an agent that is already done (already counted in ``totals``)."""
        if not reward:
            return
        if agent_id in self._handed_out:
            self.num_late_rewards += 1
        else:
            self._final_extra[agent_id] = self._final_extra.get(agent_id, 0.0) + reward

    # ---- final transitions

    def hand_out_final(self, agent_id: Any) -> float:
        """The agent's final transition is being built: the extra reward it carries."""
        self._handed_out.add(agent_id)
        return self._final_extra.pop(agent_id, 0.0)


def count_rewards_on_rows(
    key_totals: np.ndarray, keys: np.ndarray, rewards: list[float], credited_rows: list[int]
) -> np.ndarray:
    """A policy's round: the rewards column (float32), and each fast-path row's reward
    added to its key's total (``credited_rows``, the general path's, were counted by
    ``receive``). Keys are unique within a round, so one fancy-index add does it."""
    given = np.array(rewards, np.float64)
    column = given.astype(np.float32)
    if given.ndim == 1 and not np.count_nonzero(given):
        return column  # a turn-based env's usual round: nothing to add (NaN counts as nonzero)
    if credited_rows:
        given[credited_rows] = 0.0
    key_totals[keys] += given
    return column


def add_rewards_after_done(
    rewards: np.ndarray, final_rows: Sequence[int], owners: Sequence[tuple[RewardLedger, Any]]
) -> np.ndarray:
    """``rewards`` with each final transition (row ``final_rows[i]``, agent ``owners[i]``)
    carrying what its agent got after it was done; a copy only when something changes."""
    out = rewards
    for row, (ledger, agent_id) in zip(final_rows, owners):
        extra = ledger.hand_out_final(agent_id)
        if extra:
            if out is rewards:
                out = rewards.astype(np.float32, copy=True)
            out[row] += extra
    return out
