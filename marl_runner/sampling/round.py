"""Step 2 of a runner step as a value: one round's rows, per policy.

A ``Round`` is made fresh for every runner step. ``RoundCollector`` adds each
polled sub-env's data to it (then the reset obs of sub-envs reset in this
round), and ``Round.to_agent_rows`` hands each policy ONE set of columns for
its agent connectors and forward pass. Nothing of a round outlives the step,
so an exception in the middle of a step leaves no half-filled rows behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable, Mapping
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

import numpy as np

from connectors.data import AgentRows
from marl_runner.envs.step_block import BlockRow, StepBlock
from marl_runner.sampling.env_output import PollResult, SubEnvOutput
from marl_runner.sampling.episode import AgentSlot, EpisodeLayout, LayoutShape, MultiAgentEpisode
from marl_runner.sampling.fake_obs import fake_final_obs, kept_copies
from marl_runner.sampling.rewards import RewardLedger, count_rewards_on_rows
from marl_runner.sampling.stacked_rows import joined_rows
from marl_runner.sampling.trajectories import KeyTable

logger = logging.getLogger(__name__)

_EMPTY_INFO: dict = {}
_NOTHING: dict = {}
# Group slot tables kept (one per layout shape and block agent order; few in practice).
_MAX_SLOT_TABLES = 4096


class PolicyRows:
    """One policy's rows of one round, as growing lists (cheap to extend group-wise), and
    the stacked rows of ``StepBlock``s where they came in one."""

    __slots__ = (
        "obs", "rewards", "infos", "keys", "terminated_rows", "truncated_rows", "first_rows",
        "credited_rows", "stacked",
    )

    def __init__(self) -> None:
        # Rows given one by one; those of blocks are in `stacked`, at their row positions.
        self.obs: list[Any] = []
        self.rewards: list[float] = []
        self.infos: list[Any] = []
        self.keys: list[int] = []
        self.terminated_rows: list[int] = []
        self.truncated_rows: list[int] = []
        self.first_rows: list[int] = []
        # Rows of the general path: their reward is what the ledger credited, already counted.
        self.credited_rows: list[int] = []
        # (first row, obs [n, ...], float64 rewards [n]) per run of rows taken from a block.
        self.stacked: list[tuple[int, np.ndarray, np.ndarray]] = []

    def add(
        self, obs: Any, reward: float, info: Any, key: int,
        terminated: bool, truncated: bool, is_first: bool,
    ) -> None:
        """One row of the general path (the fast path extends the lists a group at a time)."""
        row = len(self.keys)
        self.credited_rows.append(row)
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

    def add_stacked(self, obs: np.ndarray, rewards: np.ndarray, keys: Iterable[int]) -> None:
        """Fast-path rows of a block, already stacked: obs ``[n, ...]``, rewards ``[n]``."""
        self.stacked.append((len(self.keys), obs, rewards))
        self.keys.extend(keys)
        self.infos.extend(repeat(_EMPTY_INFO, len(rewards)))

    def to_agent_rows(self, key_table: KeyTable) -> AgentRows:
        """The columns the agent connectors and the policy see (see docs/DESIGN.md)."""
        n = len(self.keys)
        keys = np.array(self.keys, np.int64)
        if self.stacked:
            obs, given = joined_rows(self.stacked, self.obs, self.rewards)
        else:
            obs, given = self.obs, self.rewards
        rewards = count_rewards_on_rows(key_table.reward_total, keys, given, self.credited_rows)
        # One allocation for the three flag columns (rows of it); most rounds mark none.
        terminateds, truncateds, is_first = np.zeros((3, n), bool)
        for column, marked in (
            (terminateds, self.terminated_rows),
            (truncateds, self.truncated_rows),
            (is_first, self.first_rows),
        ):
            if marked:
                column[marked] = True
        return AgentRows(
            {
                "obs": obs,
                "rewards": rewards,
                "terminateds": terminateds,
                "truncateds": truncateds,
                "infos": self.infos,
                "env_ids": key_table.env_id[keys],
                "agent_ids": key_table.agent_id[keys],
                "agent_index": key_table.agent_index[keys],
                "t": key_table.take_t(keys),
                "keys": keys,
                "is_first": is_first,
            }
        )


class Round:
    """The rows of one round, per policy id, and the sub-envs that take part (get actions)."""

    __slots__ = ("rows", "env_ids")

    def __init__(self) -> None:
        self.rows: dict[str, PolicyRows] = {}
        self.env_ids: list[int] = []

    def rows_for(self, policy_id: str) -> PolicyRows:
        """The policy's rows of this round, made on first use."""
        rows = self.rows.get(policy_id)
        if rows is None:
            rows = self.rows[policy_id] = PolicyRows()
        return rows

    def to_agent_rows(self, key_table: KeyTable) -> dict[str, AgentRows]:
        """``policy_id -> AgentRows`` for the policies that have rows this round."""
        return {pid: rows.to_agent_rows(key_table) for pid, rows in self.rows.items() if rows.keys}


class RoundCollector:
    """Turns one sub-env's output into rows of a ``Round``.

    ``new_slot(episode, agent_id)`` gives a first-time agent its slot (policy
    mapped, policy built, trajectory key allocated);
    ``original_obs_space(policy_id)`` is the space fake final obs fill.
    What each row's reward is, the episode's ``RewardLedger`` decides.
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
        self._slots_of: dict[tuple[LayoutShape, tuple], list[np.ndarray | None]] = {}
        self._warned_returning = False

    def _warn_returning(self, episode: MultiAgentEpisode, agent_id: Any) -> None:
        self._warned_returning = True
        logger.warning(
            "sub-env %d: agent %r has an obs again after it was done (terminated or "
            "truncated) in this episode; an agent is done for the rest of its episode, so it "
            "gets no action and no rows, and what it is given goes on its last transition: "
            "give a returning agent a new id (warned once)", episode.env_id, agent_id,
        )

    def collect_unchanged(
        self,
        round_: Round,
        polled: PollResult,
        episodes: Mapping[int, MultiAgentEpisode],
        skip: Container[int],
    ) -> tuple[list[MultiAgentEpisode], list[int], list[MultiAgentEpisode]]:
        """The fast path, for the whole round at once: every polled sub-env whose agents
        are exactly those of its last round and whose rewards each go on the rewarded
        agent's own row (``RewardLedger.fast_path_ok``) has its rows copied a policy group
        at a time from its episode's ``EpisodeLayout``; agents that end (and episodes that
        end with every agent's obs) have their last rows marked. A sub-env given as a
        ``BlockRow`` meets the flag and reward conditions by what a ``StepBlock`` is.

        Returns those sub-envs' episodes, the other polled sub-envs (``skip``
        excepted, in poll order) for ``collect``, and the episodes that ended.
        """
        all_obs, all_rewards, all_terminateds, all_truncateds, all_infos = polled[:5]
        keep_last_obs = self._keep_last_obs
        taken, rest, over = [], [], []
        # Sub-envs grouped by layout shape (a turn-based env's sub-envs at different turns
        # make several), each shape's in runs of poll order: a _DictRun of sub-envs given
        # as dicts, or a _BlockRun of rows of one StepBlock.
        alike: dict[LayoutShape, list[_DictRun | _BlockRun | _EndingRun]] = {}
        # The run each shape's next sub-env joins, if of its kind (and, for blocks, block).
        open_dicts: dict[LayoutShape, _DictRun] = {}
        open_blocks: dict[LayoutShape, _BlockRun] = {}
        for env_id, env_obs in all_obs.items():
            if env_id in skip:
                continue
            episode = episodes.get(env_id)
            if episode is None or not episode.layouts:
                rest.append(env_id)
                continue
            if type(env_obs) is BlockRow:
                block = env_obs.block
                layout = episode.layouts.get(block.agent_ids)
                # A block's rewards name exactly its agents: only held rewards can stop it.
                if layout is None or not episode.rewards.fast_path_ok(
                    _NOTHING, layout.shape.agent_set
                ):
                    rest.append(env_id)
                    continue
                if keep_last_obs:
                    episode.last_raw_obs.update(
                        zip(block.agent_ids, block.obs[env_obs.index].copy())
                    )
                taken.append(episode)
                shape = layout.shape
                block_run = open_blocks.get(shape)
                if block_run is None or block_run.block is not block:
                    block_run = open_blocks[shape] = _BlockRun(block, [], [])
                    alike.setdefault(shape, []).append(block_run)
                    open_dicts.pop(shape, None)
                block_run.indices.append(env_obs.index)
                block_run.layouts.append(layout)
                continue
            layout = episode.layouts.get(tuple(env_obs)) if type(env_obs) is dict else None
            if layout is None:
                rest.append(env_id)
                continue
            env_rewards = all_rewards.get(env_id) or _NOTHING
            env_terminateds = all_terminateds.get(env_id) or _NOTHING
            env_truncateds = all_truncateds.get(env_id) or _NOTHING
            if not episode.rewards.fast_path_ok(env_rewards, layout.shape.agent_set):
                rest.append(env_id)
                continue
            # any(): a flag's truth value, ~2x faster than `True in` (no == per flag).
            if any(env_terminateds.values()) or any(env_truncateds.values()):
                ended = _agents_ending(episode, env_obs, env_terminateds, env_truncateds)
                if ended is None:  # an agent ends without its obs
                    rest.append(env_id)
                    continue
                if ended[2]:
                    over.append(episode)
                # Agents die: the same rows, their last ones marked; a run of its own.
                if keep_last_obs:
                    episode.last_raw_obs.update(kept_copies(env_obs))
                taken.append(episode)
                alike.setdefault(layout.shape, []).append(_EndingRun(
                    episode, layout, env_obs, env_rewards, all_infos.get(env_id) or _NOTHING, ended
                ))
                open_dicts.pop(layout.shape, None)
                open_blocks.pop(layout.shape, None)
                continue
            if keep_last_obs:
                episode.last_raw_obs.update(kept_copies(env_obs))
            taken.append(episode)
            run = open_dicts.get(layout.shape)
            if run is None:
                run = open_dicts[layout.shape] = _DictRun([], [], [], [])
                alike.setdefault(layout.shape, []).append(run)
                if open_blocks:  # (none without blocks: the sync path skips the pop)
                    open_blocks.pop(layout.shape, None)
            run.layouts.append(layout)
            run.obs.append(env_obs)
            run.rewards.append(env_rewards)
            run.infos.append(all_infos.get(env_id) or _NOTHING)
        for shape, runs in alike.items():
            for run in runs:
                if type(run) is _DictRun:
                    _add_alike(round_, shape, run)
                elif type(run) is _EndingRun:
                    _add_ending(round_, shape, run)
                else:
                    self._add_block_rows(round_, shape, run)
        return taken, rest, over

    def _add_block_rows(self, round_: Round, shape: LayoutShape, run: _BlockRun) -> None:
        """Rows of a run of one block's sub-envs whose agents are grouped alike (``shape``):
        per policy group, obs and rewards taken out of the block by one index each."""
        block = run.block
        obs, rewards = block.obs, block.rewards
        if run.indices != list(range(len(obs))):  # some rows, or polled in another order
            obs, rewards = obs[run.indices], rewards[run.indices]
        slots = self._group_slots(shape, block.agent_ids)
        row_shape = obs.shape[2:]
        for index, ((policy_id, _, _), group_slots) in enumerate(zip(shape.groups, slots)):
            group_obs = obs if group_slots is None else obs[:, group_slots]
            group_rewards = rewards if group_slots is None else rewards[:, group_slots]
            round_.rows_for(policy_id).add_stacked(
                group_obs.reshape(-1, *row_shape),
                group_rewards.reshape(-1),
                chain.from_iterable(map(itemgetter(index), map(_GROUP_KEYS, run.layouts))),
            )

    def _group_slots(
        self, shape: LayoutShape, agent_ids: tuple
    ) -> list[slice | np.ndarray | None]:
        """Per policy group of ``shape``: where its agents sit in a block's ``agent_ids``
        (None: all of them, in order; a slice where they sit side by side, as one team's
        agents usually do, so that the group's rows are a view, not a gather)."""
        found = self._slots_of.get((shape, agent_ids))
        if found is None:
            if len(self._slots_of) >= _MAX_SLOT_TABLES:
                self._slots_of.clear()
            position = {agent_id: slot for slot, agent_id in enumerate(agent_ids)}
            found = [
                None if ids == agent_ids else _slots([position[a] for a in ids])
                for _, ids, _ in shape.groups
            ]
            self._slots_of[(shape, agent_ids)] = found
        return found

    def collect(self, round_: Round, episode: MultiAgentEpisode, output: SubEnvOutput) -> None:
        """The general path for one sub-env: spawning and dying agents, held rewards,
        episode ends, reset obs."""
        if self._keep_last_obs:
            episode.last_raw_obs.update(kept_copies(output.obs))
        if output.rewards:
            episode.rewards.receive(output.rewards)
        self._collect_per_agent(round_, episode, output)

    def _collect_per_agent(
        self, round_: Round, episode: MultiAgentEpisode, output: SubEnvOutput
    ) -> None:
        """Agent by agent; the ledger decides each row's reward; the layout is remade."""
        all_terminated, all_truncated = output.all_terminated, output.all_truncated
        env_obs, env_terminateds, env_truncateds = output.obs, output.terminateds, output.truncateds
        slots = episode.slots
        rows: list[_Row] = []
        born_done = []
        clean = True  # every obs agent gets a row that is not its last
        for agent_id, agent_obs in env_obs.items():
            terminated = all_terminated or bool(env_terminateds.get(agent_id, False))
            truncated = all_truncated or bool(env_truncateds.get(agent_id, False))
            slot = slots.get(agent_id)
            if slot is None:
                if terminated or truncated:
                    born_done.append(agent_id)  # no transition to close, ever
                    clean = False
                    continue
                slot = self._new_slot(episode, agent_id)
                is_first = True
            elif slot.done:
                clean = False
                if not self._warned_returning:
                    self._warn_returning(episode, agent_id)
                continue  # no row: a reward after it is done, the ledger keeps
            else:
                is_first = False
            rows.append(_Row(slot, agent_obs, output.infos.get(agent_id), terminated, truncated, is_first))

        episode_over = all_terminated or all_truncated
        for agent_id, slot in slots.items():
            if slot.done or agent_id in env_obs:
                continue
            own_terminated = bool(env_terminateds.get(agent_id, False))
            own_truncated = bool(env_truncateds.get(agent_id, False))
            if episode_over or own_terminated or own_truncated:
                rows.append(self._fake_final_row(
                    episode, slot, all_terminated or own_terminated, all_truncated or own_truncated
                ))

        rewards = episode.rewards.settle(
            output.rewards, [(row.slot.agent_id, row.is_first) for row in rows], slots, born_done
        )
        groups: dict[str, tuple[list, list]] = {}
        for row, reward in zip(rows, rewards):
            slot = row.slot
            round_.rows_for(slot.policy_id).add(
                row.obs, reward, row.info, slot.key, row.terminated, row.truncated, row.is_first
            )
            if row.terminated or row.truncated:
                slot.done = True
                clean = False
            else:
                group = groups.get(slot.policy_id)
                if group is None:
                    group = groups[slot.policy_id] = ([], [])
                group[0].append(slot.agent_id)
                group[1].append(slot.key)

        if not clean:
            episode.layouts.clear()  # a layout naming an agent now done must not be used
        elif groups:
            episode.layouts[tuple(env_obs)] = EpisodeLayout(groups)

    def _fake_final_row(
        self, episode: MultiAgentEpisode, slot: AgentSlot, terminated: bool, truncated: bool
    ) -> _Row:
        """Closes the last transition of an agent that got no final obs from the env."""
        space = self._original_obs_space(slot.policy_id)
        fake = fake_final_obs(space, self._fake_obs_mode, episode.last_raw_obs.get(slot.agent_id))
        return _Row(slot, fake, None, terminated, truncated, False)


def _slots(positions: list[int]) -> slice | np.ndarray:
    """``positions`` as a slice when they run up one by one, else as an index array."""
    first = positions[0]
    if positions == list(range(first, first + len(positions))):
        return slice(first, first + len(positions))
    return np.array(positions, np.intp)


def _add_alike(round_: Round, shape: LayoutShape, run: _DictRun) -> None:
    """Rows of sub-envs given as dicts whose agents are grouped alike (``shape``): per
    policy group, each column read from every sub-env's dict by C-level iteration."""
    obs_dicts, reward_dicts, info_dicts = run.obs, run.rewards, run.infos
    for index, (policy_id, agent_ids, rows_of) in enumerate(shape.groups):
        rows = round_.rows_for(policy_id)
        rows.obs.extend(rows_of(obs_dicts))
        rows.rewards.extend(RewardLedger.rewards_on_rows(reward_dicts, agent_ids, rows_of))
        try:
            infos = list(rows_of(info_dicts))
        except KeyError:  # some agents without an info
            infos = [info.get(agent_id, _EMPTY_INFO) for info in info_dicts for agent_id in agent_ids]
        rows.infos.extend(infos)
        rows.keys.extend(chain.from_iterable(map(itemgetter(index), map(_GROUP_KEYS, run.layouts))))


def _agents_ending(
    episode: MultiAgentEpisode, env_obs: dict, terminateds: Mapping, truncateds: Mapping
) -> tuple[list, list, bool] | None:
    """The observing agents terminated and truncated this round (flags read in C) and
    whether the episode is over, when no agent needs what only the general path gives (a
    fake final obs: an agent that ends without its obs, or, when the episode is over, a
    live agent not observing); else None. Flags repeated for agents done before are left."""
    all_terminated, all_truncated = terminateds.get("__all__"), truncateds.get("__all__")
    over = bool(all_terminated or all_truncated)
    slots = episode.slots
    if over and sum(not slot.done for slot in slots.values()) != len(env_obs):
        return None
    ending = []
    for everyone, flags in ((all_terminated, terminateds), (all_truncated, truncateds)):
        if everyone:
            ending.append(list(env_obs))
            continue
        flagged = [a for a in compress(flags.keys(), flags.values()) if a != "__all__"]
        if not env_obs.keys() >= set(flagged):
            for agent_id in flagged:
                slot = slots.get(agent_id)
                if agent_id not in env_obs and (slot is None or not slot.done):
                    return None
            flagged = [a for a in flagged if a in env_obs]
        ending.append(flagged)
    return ending[0], ending[1], over


def _add_ending(round_: Round, shape: LayoutShape, run: _EndingRun) -> None:
    """A fast-path sub-env in which some agents end: its rows as ``_add_alike`` adds them
    (their rewards counted as the general path counts them), those agents' rows marked last
    (their slots done), and the episode's layout made again without them, so the next round
    stays on the fast path."""
    episode, layout = run.episode, run.layout
    first_row = {pid: len(round_.rows_for(pid).keys) for pid, _, _ in shape.groups}
    _add_alike(round_, shape, _DictRun([layout], [run.obs], [run.rewards], [run.infos]))
    # Counted now, as the general path counts them: the episode may end before the round's
    # rows are (and its totals are read then); the rows are credited so as not to count twice.
    episode.rewards.receive(run.rewards)
    for pid, ids, _ in shape.groups:
        round_.rows[pid].credited_rows.extend(range(first_row[pid], first_row[pid] + len(ids)))
    terminated, truncated, _ = run.ended
    slots = episode.slots
    group_ids = {pid: ids for pid, ids, _ in shape.groups}
    for agent_ids, marked in ((terminated, "terminated_rows"), (truncated, "truncated_rows")):
        for agent_id in agent_ids:
            slot = slots[agent_id]
            slot.done = True
            row = first_row[slot.policy_id] + group_ids[slot.policy_id].index(agent_id)
            getattr(round_.rows[slot.policy_id], marked).append(row)
    ended = {*terminated, *truncated}
    groups = {}
    for (pid, ids, _), keys in zip(shape.groups, layout.group_keys):
        kept = [(agent_id, key) for agent_id, key in zip(ids, keys) if agent_id not in ended]
        if kept:
            groups[pid] = ([agent_id for agent_id, _ in kept], [key for _, key in kept])
    episode.layouts.clear()  # layouts naming the ended agents must not be used
    if groups:
        episode.layouts[tuple(agent_id for agent_id in run.obs if agent_id not in ended)] = (
            EpisodeLayout(groups)
        )


class _EndingRun(NamedTuple):
    """A fast-path sub-env in which some agents end (terminated, truncated agent ids)."""

    episode: MultiAgentEpisode
    layout: EpisodeLayout
    obs: dict
    rewards: dict
    infos: dict
    ended: tuple[list, list, bool]


class _DictRun(NamedTuple):
    """Fast-path sub-envs given as dicts, one layout shape, in poll order."""

    layouts: list[EpisodeLayout]
    obs: list[dict]
    rewards: list[dict]
    infos: list[dict]


class _BlockRun(NamedTuple):
    """Fast-path sub-envs given as rows ``indices`` of one ``StepBlock``, one layout shape."""

    block: StepBlock
    indices: list[int]
    layouts: list[EpisodeLayout]


_GROUP_KEYS = attrgetter("group_keys")


class _Row(NamedTuple):
    """One agent's row of the general path, before the ledger says what reward it carries."""

    slot: AgentSlot
    obs: Any
    info: Any
    terminated: bool
    truncated: bool
    is_first: bool
