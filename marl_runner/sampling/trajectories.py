"""Columnar trajectory storage: each policy's rows in column buffers, transitions built in bulk.

Each stored row is one observation event of one agent: the obs (after agent
connectors) with the reward credited with it, its flags and infos, and the
action the policy took on it. A transition pairs a row with the next row of
the same trajectory key, so ``new_obs[i] == obs[i + 1]`` holds by
construction and no observation is stored twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from marl_runner.batch import SampleBatch
from marl_runner.sampling.column_block import allocate_columns, take_rows
from marl_runner.sampling.columns import ColumnBuffer
from marl_runner.sampling.rewards import add_rewards_after_done

# Columns read from the *closing* row of a transition; all others come from its opening row.
CLOSING_COLUMNS = ("rewards", "terminateds", "truncateds", "infos")
# Columns handed out twice: from the opening row, and from the closing row under a second name.
PAIRED_COLUMNS = {"obs": "new_obs", "env_state": "new_env_state"}
KEY_COLUMN = "keys"
# What a build with no transition returns: no finished keys, no segments (read-only, shared).
_NO_KEYS = np.zeros(0, np.int64)
_NO_SEGMENTS = np.zeros((0, 3), np.int64)
_NO_KEYS.flags.writeable = _NO_SEGMENTS.flags.writeable = False


class KeyTable:
    """Per-trajectory facts, indexed by small recycled integer keys.

    A key names one agent in one episode from its first obs until its last
    transition has been handed out in a batch; then it is released.
    """

    _ARRAYS = (
        "env_id", "eps_id", "agent_index", "next_t", "agent_id", "reward_total",
        "episode_start_step",
    )  # fmt: skip

    def __init__(self, capacity: int = 256) -> None:
        self.env_id = np.zeros(capacity, np.int64)
        self.eps_id = np.zeros(capacity, np.int64)
        self.agent_index = np.zeros(capacity, np.int64)
        # Time index the key's next obs gets (its row count so far).
        self.next_t = np.zeros(capacity, np.int64)
        self.agent_id = np.empty(capacity, object)
        # Rewards of the key's fast-path rows so far (see rewards.count_rewards_on_rows).
        self.reward_total = np.zeros(capacity, np.float64)
        # The episode's ``start_step``: a row's env_t is its sub-env's steps minus this.
        self.episode_start_step = np.zeros(capacity, np.int64)
        self.episode: list[Any] = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))

    @property
    def capacity(self) -> int:
        """How many keys the tables hold now (they double when full)."""
        return len(self.env_id)

    def allocate(self, episode: Any, agent_index: int, agent_id: Any) -> int:
        """A free key for one agent's trajectory in ``episode``."""
        if not self._free:
            self._grow()
        key = self._free.pop()
        self.env_id[key] = episode.env_id
        self.eps_id[key] = episode.episode_id
        self.agent_index[key] = agent_index
        self.next_t[key] = 0
        self.reward_total[key] = 0.0
        self.agent_id[key] = agent_id
        self.episode_start_step[key] = episode.start_step
        self.episode[key] = episode
        return key

    def live_reward_totals(self, episode: Any) -> dict[Any, float]:
        """``agent_id -> fast-path reward total`` of the episode's keys not released yet."""
        owner, totals = self.episode, self.reward_total
        return {
            slot.agent_id: float(totals[slot.key])
            for slot in episode.slots.values()
            if owner[slot.key] is episode
        }

    def take_t(self, keys: np.ndarray) -> np.ndarray:
        """The time index of one new row per key (keys are unique within a round)."""
        t = self.next_t[keys]
        self.next_t[keys] = t + 1
        return t

    def release(self, keys: np.ndarray) -> None:
        """Frees finished (or dropped) trajectories; their reward totals go to the episode."""
        totals = self.reward_total[keys].tolist()
        for key, total in zip(keys.tolist(), totals):
            self.episode[key].rewards.bank(self.agent_id[key], total)
            self.episode[key] = None
            self.agent_id[key] = None
            self._free.append(key)

    def mask(self, keys: list[int] | np.ndarray) -> np.ndarray:
        """A boolean lookup over all keys, true for ``keys``."""
        mask = np.zeros(self.capacity, bool)
        mask[np.asarray(keys, np.int64)] = True
        return mask

    def _grow(self) -> None:
        old = self.capacity
        new = old * 2
        for name in self._ARRAYS:
            array = getattr(self, name)
            grown = np.zeros(new, array.dtype) if array.dtype != object else np.empty(new, object)
            grown[:old] = array
            setattr(self, name, grown)
        self.episode.extend([None] * old)
        self._free.extend(range(new - 1, old - 1, -1))


class PolicyTrajectories:
    """The stored rows of one policy, in growable column buffers (one row per obs event)."""

    def __init__(self, policy_id: str) -> None:
        self.policy_id = policy_id
        self.rows = ColumnBuffer()

    def add(self, chunk: dict[str, Any], num_rows: int) -> None:
        """Stores one round's rows of this policy."""
        self.rows.append(chunk, num_rows)

    def extend(self, other: PolicyTrajectories) -> None:
        """Takes over another store's rows (a removed policy's, for its remapped agents)."""
        if other.rows.size:
            self.rows.append(other.rows.view(), other.rows.size)
        other.rows.clear()

    def drop_keys(self, key_mask: np.ndarray) -> None:
        """Discards every row of the masked keys (a faulty episode's data)."""
        if self.rows.size:
            self.rows.keep(np.flatnonzero(~key_mask[self.rows.view()[KEY_COLUMN]]))

    def build(
        self, key_mask: np.ndarray, keys: KeyTable, unroll_id: int
    ) -> tuple[SampleBatch | None, np.ndarray, np.ndarray]:
        """Turns the rows of the masked keys into transitions.

        Returns the batch (None when no transition closed), the keys whose
        trajectories finished (to release), and the start/stop row of each
        key's transitions in the batch (as a ``[num_keys, 3]`` array of
        key, start, stop) for per-trajectory post-processing.
        """
        if not self.rows.size:
            return None, _NO_KEYS, _NO_SEGMENTS
        columns = self.rows.view()
        row_keys = columns[KEY_COLUMN]
        selected = key_mask[row_keys]
        if selected.all():
            chosen, others = None, None
        elif not selected.any():
            return None, _NO_KEYS, _NO_SEGMENTS
        else:
            chosen, others = np.flatnonzero(selected), np.flatnonzero(~selected)
            row_keys = row_keys[chosen]

        # Rows by key, time order kept within a key; ``order`` indexes the buffer's rows.
        order = _stable_argsort(row_keys, keys.capacity)
        sorted_keys = row_keys[order]
        if chosen is not None:
            order = chosen[order]
        # Each key's rows are one group; all but a group's last row open a transition.
        opens = sorted_keys[:-1] == sorted_keys[1:]
        group_ends = np.append(np.flatnonzero(~opens), len(order) - 1)
        last_rows = order[group_ends]
        done = columns["terminateds"][last_rows] | columns["truncateds"][last_rows]
        carry = last_rows[~done]
        finished = sorted_keys[group_ends[done]]
        # The last row of each unfinished trajectory (and every row not built) stays.
        keep = carry if others is None else np.sort(np.concatenate([carry, others]))
        if not opens.any():
            self.rows.keep(keep)
            return None, finished, _NO_SEGMENTS

        # Per trajectory with transitions (a segment of the batch): key, length, last row.
        group_sizes = np.diff(group_ends, prepend=-1)
        with_transitions = group_sizes > 1
        segment_keys = sorted_keys[group_ends[with_transitions]]
        runs = group_sizes[with_transitions] - 1
        segment_ends = np.cumsum(runs) - 1
        opening = order[:-1][opens]
        closing = order[1:][opens]
        agent_ids = keys.agent_id[segment_keys].astype(str)  # str() once per trajectory
        batch = SampleBatch(
            allocate_columns(_batch_layout(columns, agent_ids.dtype), len(opening))
        )
        for name, column in columns.items():
            if name == KEY_COLUMN:
                continue
            rows = closing if name in CLOSING_COLUMNS else opening
            batch[name] = opened = take_rows(column, rows, batch[name])
            if name in PAIRED_COLUMNS:
                twin = PAIRED_COLUMNS[name]
                batch[twin] = _closing_of_pairs(batch[twin], opened, column, closing, segment_ends)
        self.rows.keep(keep)

        # Per-trajectory values: one per segment, spread over its rows.
        segment_of_row = np.repeat(np.arange(len(runs)), runs)
        take_rows(keys.eps_id[segment_keys], segment_of_row, batch["eps_id"])
        take_rows(keys.env_id[segment_keys], segment_of_row, batch["env_id"])
        take_rows(keys.agent_index[segment_keys], segment_of_row, batch["agent_index"])
        take_rows(agent_ids, segment_of_row, batch["agent_id"])
        batch["unroll_id"].fill(unroll_id)
        if "seq_lens" in batch:
            batch["seq_lens"].fill(1)
        closes_trajectory = done[with_transitions]
        _add_rewards_after_done(
            batch, segment_ends[closes_trajectory], segment_keys[closes_trajectory], keys
        )
        segments = np.stack([segment_keys, segment_ends + 1 - runs, segment_ends + 1], axis=1)
        return batch, finished, segments


def _batch_layout(columns: dict[str, np.ndarray], agent_id_dtype: np.dtype) -> dict:
    """Each batch column's dtype and row shape, in the batch's column order: the stored
    columns (a paired one followed by its closing twin), then the per-trajectory ones."""
    layout = {}
    for name, column in columns.items():
        if name != KEY_COLUMN:
            layout[name] = (column.dtype, column.shape[1:])
            if name in PAIRED_COLUMNS:
                layout[PAIRED_COLUMNS[name]] = layout[name]
    int64 = np.dtype(np.int64)
    layout.update(eps_id=(int64, ()), env_id=(int64, ()), agent_index=(int64, ()))
    layout.update(agent_id=(agent_id_dtype, ()), unroll_id=(int64, ()))
    if "state_in_0" in columns:
        layout["seq_lens"] = (np.dtype(np.int32), ())
    return layout


def _closing_of_pairs(
    out: np.ndarray | None,
    opened: np.ndarray,
    column: np.ndarray,
    closing: np.ndarray,
    segment_ends: np.ndarray,
) -> np.ndarray:
    """The closing rows' values of a paired column (``new_obs``), written into ``out`` (a new
    array when None): within a trajectory a transition closes on the row the next one opens
    on, so all but each trajectory's last come from ``opened`` shifted by one (a contiguous
    copy), the last ones from ``column``."""
    if out is None:
        out = np.empty_like(opened)
    out[:-1] = opened[1:]
    out[segment_ends] = np.take(column, closing[segment_ends], axis=0)
    return out


def _stable_argsort(keys: np.ndarray, num_keys: int) -> np.ndarray:
    """Stable argsort of trajectory keys; as uint16 when they fit (numpy radix-sorts those)."""
    if num_keys <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def _add_rewards_after_done(
    batch: SampleBatch, final_rows: np.ndarray, final_keys: np.ndarray, keys: KeyTable
) -> None:
    """Final transitions carry the rewards their agent got after it was done (the ledger's call)."""
    if not len(final_rows):
        return
    episodes = keys.episode
    owners = [
        (episodes[key].rewards, agent_id)
        for key, agent_id in zip(final_keys.tolist(), keys.agent_id[final_keys].tolist())
    ]
    batch["rewards"] = add_rewards_after_done(batch["rewards"], final_rows.tolist(), owners)
