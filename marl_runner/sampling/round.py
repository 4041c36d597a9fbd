"""Step 2 of a runner step as a value: one round's rows, per policy.

A ``Round`` is made fresh for every runner step. ``RoundCollector`` adds each
polled sub-env's data to it (then the reset obs of sub-envs reset in this
round), and ``Round.to_agent_rows`` hands each policy ONE set of columns for
its agent connectors and forward pass. Nothing of a round outlives the step,
so an exception in the middle of a step leaves no half-filled rows behind.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np

from connectors.data import AgentRows
from marl_runner.sampling.episode import AgentSlot, EpisodeLayout, MultiAgentEpisode
from marl_runner.sampling.fake_obs import fake_final_obs
from marl_runner.sampling.trajectories import KeyTable

_EMPTY_INFO: dict = {}


class PolicyRows:
    """One policy's rows of one round, as growing lists (cheap to extend group-wise)."""

    __slots__ = ("obs", "rewards", "infos", "keys", "terminated_rows", "truncated_rows", "first_rows")

    def __init__(self) -> None:
        self.obs: list[Any] = []
        self.rewards: list[float] = []
        self.infos: list[Any] = []
        self.keys: list[int] = []
        self.terminated_rows: list[int] = []
        self.truncated_rows: list[int] = []
        self.first_rows: list[int] = []

    def add(
        self, obs: Any, reward: float, info: Any, key: int,
        terminated: bool, truncated: bool, is_first: bool,
    ) -> None:
        row = len(self.keys)
        self.obs.append(obs)
        self.rewards.append(reward)
        self.infos.append(_EMPTY_INFO if info is None else info)
        self.keys.append(key)
        if terminated:
            self.terminated_rows.append(row)
        if truncated:
            self.truncated_rows.append(row)
        if is_first:
            self.first_rows.append(row)

    def to_agent_rows(self, key_table: KeyTable) -> AgentRows:
        """The columns the agent connectors and the policy see (see docs/DESIGN.md)."""
        n = len(self.keys)
        keys = np.array(self.keys, np.int64)
        flags = {}
        for name, marked in (
            ("terminateds", self.terminated_rows),
            ("truncateds", self.truncated_rows),
            ("is_first", self.first_rows),
        ):
            column = np.zeros(n, bool)
            if marked:
                column[marked] = True
            flags[name] = column
        return AgentRows(
            {
                "obs": self.obs,
                "rewards": np.array(self.rewards, np.float32),
                "terminateds": flags["terminateds"],
                "truncateds": flags["truncateds"],
                "infos": self.infos,
                "env_ids": key_table.env_id[keys],
                "agent_ids": key_table.agent_id[keys],
                "agent_index": key_table.agent_index[keys],
                "t": key_table.take_t(keys),
                "keys": keys,
                "is_first": flags["is_first"],
            }
        )


class Round:
    """The rows of one round, per policy id."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[str, PolicyRows] = {}

    def rows_for(self, policy_id: str) -> PolicyRows:
        rows = self.rows.get(policy_id)
        if rows is None:
            rows = self.rows[policy_id] = PolicyRows()
        return rows

    def to_agent_rows(self, key_table: KeyTable) -> dict[str, AgentRows]:
        return {pid: rows.to_agent_rows(key_table) for pid, rows in self.rows.items() if rows.keys}


class RoundCollector:
    """Turns one sub-env's raw output into rows of a ``Round``.

    ``new_slot(episode, agent_id)`` gives a first-time agent its slot (policy
    mapped, policy built, trajectory key allocated);
    ``original_obs_space(policy_id)`` is the space fake final obs fill.
    """

    def __init__(
        self,
        new_slot: Callable[[MultiAgentEpisode, Any], AgentSlot],
        original_obs_space: Callable[[str], Any],
        fake_obs_mode: str,
    ) -> None:
        self._new_slot = new_slot
        self._original_obs_space = original_obs_space
        self._fake_obs_mode = fake_obs_mode
        self._keep_last_obs = fake_obs_mode == "last"

    def collect(
        self,
        round_: Round,
        episode: MultiAgentEpisode,
        env_obs: dict,
        env_rewards: dict,
        env_terminateds: dict,
        env_truncateds: dict,
        env_infos: dict,
    ) -> None:
        """Adds one sub-env's data, whole policy groups at once when nothing changed."""
        if self._keep_last_obs:
            episode.last_raw_obs.update(env_obs)
        ledger = episode.rewards
        if env_rewards:
            ledger.receive(env_rewards)
        layout = episode.layout
        if (
            layout is not None
            and layout.agent_set == env_obs.keys()
            and env_rewards.keys() <= layout.agent_set
            and not ledger.held
            and True not in env_terminateds.values()
            and True not in env_truncateds.values()
        ):
            zeros, empty = repeat(0.0), repeat(_EMPTY_INFO)
            rows_by_policy = round_.rows
            for policy_id, agent_ids, keys in layout.groups:
                rows = rows_by_policy.get(policy_id) or round_.rows_for(policy_id)
                rows.obs.extend(map(env_obs.__getitem__, agent_ids))
                rows.rewards.extend(map(env_rewards.get, agent_ids, zeros))
                rows.infos.extend(map(env_infos.get, agent_ids, empty))
                rows.keys.extend(keys)
            return
        self._collect_per_agent(
            round_, episode, env_obs, env_rewards, env_terminateds, env_truncateds, env_infos
        )

    def _collect_per_agent(
        self,
        round_: Round,
        episode: MultiAgentEpisode,
        env_obs: dict,
        env_rewards: dict,
        env_terminateds: dict,
        env_truncateds: dict,
        env_infos: dict,
    ) -> None:
        """The general path: spawning and dying agents, held rewards, episode ends."""
        all_terminated = bool(env_terminateds.get("__all__", False))
        all_truncated = bool(env_truncateds.get("__all__", False))
        slots = episode.slots
        ledger = episode.rewards
        for agent_id, reward in env_rewards.items():
            if agent_id in env_obs:
                continue
            slot = slots.get(agent_id)
            if slot is not None and slot.done:
                ledger.give_after_done(agent_id, reward)
            else:
                ledger.hold(agent_id, reward)

        groups: dict[str, tuple[list, list]] = {}
        for agent_id, agent_obs in env_obs.items():
            terminated = all_terminated or bool(env_terminateds.get(agent_id, False))
            truncated = all_truncated or bool(env_truncateds.get(agent_id, False))
            reward = env_rewards.get(agent_id, 0.0)
            slot = slots.get(agent_id)
            if slot is None:
                if terminated or truncated:
                    # Seen for the first time and already done: no transition to close.
                    ledger.forfeit(agent_id)
                    continue
                slot = self._new_slot(episode, agent_id)
                # Its first row closes nothing; what it was given waits for the next row.
                ledger.hold(agent_id, reward)
                row_reward, is_first = 0.0, True
            elif slot.done:
                ledger.give_after_done(agent_id, reward)
                continue
            else:
                row_reward, is_first = ledger.credit(agent_id, reward), False
            round_.rows_for(slot.policy_id).add(
                agent_obs, row_reward, env_infos.get(agent_id), slot.key,
                terminated, truncated, is_first,
            )
            if terminated or truncated:
                slot.done = True
            else:
                group = groups.get(slot.policy_id)
                if group is None:
                    group = groups[slot.policy_id] = ([], [])
                group[0].append(agent_id)
                group[1].append(slot.key)

        episode_over = all_terminated or all_truncated
        for agent_id, slot in slots.items():
            if slot.done or agent_id in env_obs:
                continue
            own_terminated = bool(env_terminateds.get(agent_id, False))
            own_truncated = bool(env_truncateds.get(agent_id, False))
            if episode_over or own_terminated or own_truncated:
                self._add_fake_final_obs(
                    round_, episode, slot,
                    all_terminated or own_terminated, all_truncated or own_truncated,
                )

        if episode_over:
            episode.layout = None
        else:
            episode.layout = EpisodeLayout(
                frozenset(a for ids, _ in groups.values() for a in ids),
                [(pid, tuple(ids), tuple(keys)) for pid, (ids, keys) in groups.items()],
            )

    def _add_fake_final_obs(
        self, round_: Round, episode: MultiAgentEpisode, slot: AgentSlot,
        terminated: bool, truncated: bool,
    ) -> None:
        """Closes the last transition of an agent that got no final obs from the env."""
        space = self._original_obs_space(slot.policy_id)
        fake = fake_final_obs(space, self._fake_obs_mode, episode.last_raw_obs.get(slot.agent_id))
        reward = episode.rewards.credit(slot.agent_id, 0.0)
        round_.rows_for(slot.policy_id).add(fake, reward, None, slot.key, terminated, truncated, False)
        slot.done = True
