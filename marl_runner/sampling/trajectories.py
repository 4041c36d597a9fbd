"""Columnar trajectory storage: each policy's rows in column buffers, transitions built in bulk.

Each stored row is one observation event of one agent: the obs (after agent
connectors) with the reward credited with it, its flags and infos, and the
action the policy took on it. A transition pairs a row with the next row of
the same trajectory key, so ``new_obs[i] == obs[i + 1]`` holds by
construction and no observation is stored twice.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from marl_runner.batch import SampleBatch
from marl_runner.sampling.column_block import allocate_columns, take_rows
from marl_runner.sampling.columns import ArrayPool, ColumnBuffer
from marl_runner.sampling.rewards import add_rewards_after_done

# Columns read from the *closing* row of a transition; all others come from its opening row.
CLOSING_COLUMNS = ("rewards", "terminateds", "truncateds", "infos")
# Columns handed out twice: from the opening row, and from the closing row under a second name.
PAIRED_COLUMNS = {"obs": "new_obs", "env_state": "new_env_state"}
KEY_COLUMN = "keys"
# Stored columns nothing but the batch reads (the ones ``exclude`` may leave unstored).
_STORED_FOR_THE_BATCH_ONLY = frozenset({"infos", "env_t", "policy_version", "action_dist_inputs"})
# What a build with no transition returns: no finished keys, no segments (read-only, shared).
_NO_KEYS = np.zeros(0, np.int64)
_NO_KEYS.flags.writeable = False
#: The column that says whether a trajectory's first row in a batch continues an earlier
#: fragment's transitions (True) or is where its agent's episode starts (False: t == 0).
CONTINUES = "continues"


class KeyTable:
    """Per-trajectory facts, indexed by small recycled integer keys.

    A key names one agent in one episode from its first obs until its last
    transition has been handed out in a batch; then it is released.
    """

    _ARRAYS = (
        "env_id", "eps_id", "agent_index", "next_t", "agent_id", "reward_total",
        "episode_start_step", "built", "trained",
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
        # Whether a built batch already holds transitions of the key.
        self.built = np.zeros(capacity, bool)
        # Whether the key's rows are stored (its episode is not kept out of training).
        self.trained = np.zeros(capacity, bool)
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
        self.built[key] = False
        self.trained[key] = episode.training_enabled
        self.episode[key] = episode
        return key

    def live_slots(self, episode: Any) -> list[Any]:
        """The episode's agent slots whose key is not released yet. A key released when an
        agent's final transition went out may name a later agent of the same episode by
        now: the slot's place in the episode tells the two apart."""
        owner, index = self.episode, self.agent_index
        return [
            slot for slot in episode.slots.values()
            if owner[slot.key] is episode and index[slot.key] == slot.index
        ]

    def live_reward_totals(self, episode: Any) -> dict[Any, float]:
        """``agent_id -> fast-path reward total`` of the episode's keys not released yet."""
        totals = self.reward_total
        return {slot.agent_id: float(totals[slot.key]) for slot in self.live_slots(episode)}

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


class Segments:
    """Where each trajectory's transitions lie in a built batch, for per-trajectory passes
    (worked out only when one asks): ``order`` puts the batch's rows (stored order) into
    key order, and each ``table`` row is (key, start, stop) of one trajectory's run in that
    order."""

    def __init__(self, batch_keys: np.ndarray, num_keys: int) -> None:
        self.batch_keys = batch_keys
        self._num_keys = num_keys

    @functools.cached_property
    def order(self) -> np.ndarray:
        """Batch row indices in key order (stable: time order within a key)."""
        return _stable_argsort(self.batch_keys, self._num_keys)

    @functools.cached_property
    def table(self) -> np.ndarray:
        """(key, start, stop) per trajectory, over the rows put in key order by ``order``."""
        sorted_keys = self.batch_keys[self.order]
        if not len(sorted_keys):
            return np.zeros((0, 3), np.int64)
        starts = np.flatnonzero(np.append(True, sorted_keys[1:] != sorted_keys[:-1]))
        stops = np.append(starts[1:], len(sorted_keys))
        return np.stack([sorted_keys[starts], starts, stops], axis=1)


_NO_SEGMENTS = Segments(_NO_KEYS, 1)


class PolicyTrajectories:
    """The stored rows of one policy, in growable column buffers (one row per obs event).

    Rows that end their trajectory (a done flag) go to ``finals``, all others to
    ``rows``: every row of ``rows`` but each unfinished trajectory's last opens a
    transition, so when every sub-env's fragment is built at once the opening rows are
    the buffer's first rows and the batch reads them where they were stored.
    """

    def __init__(self, policy_id: str, exclude: frozenset[str] = frozenset()) -> None:
        self.policy_id = policy_id
        self.rows = ColumnBuffer()
        self.finals = ColumnBuffer()
        self.exclude = exclude
        # Left out columns that only the batch reads: not even stored.
        self._not_stored = tuple(exclude & _STORED_FOR_THE_BATCH_ONLY)
        self._blocks = ArrayPool()

    @property
    def size(self) -> int:
        """Rows held."""
        return self.rows.size + self.finals.size

    def add(self, chunk: dict[str, Any], num_rows: int) -> None:
        """Stores one round's rows of this policy."""
        for name in self._not_stored:
            chunk.pop(name, None)
        for name, column in chunk.items():
            if np.ndim(column) and len(column) != num_rows:
                raise ValueError(
                    f"policy {self.policy_id!r}: column {name!r} has {len(column)} rows in this "
                    f"round, expected one per row ({num_rows}); a custom policy's outputs or a "
                    "connector's columns must have one row per input row"
                )
        done = np.asarray(chunk["terminateds"]) | np.asarray(chunk["truncateds"])
        if not done.any():
            self.rows.append(chunk, num_rows)
            return
        for buffer, rows in ((self.rows, np.flatnonzero(~done)), (self.finals, np.flatnonzero(done))):
            if len(rows):
                buffer.append(chunk, len(rows), rows)

    def extend(self, other: PolicyTrajectories) -> None:
        """Takes over another store's rows (a removed policy's, for its remapped agents)."""
        for mine, theirs in ((self.rows, other.rows), (self.finals, other.finals)):
            if theirs.size:
                mine.append(theirs.view(), theirs.size)
            theirs.clear()

    def drop_keys(self, key_mask: np.ndarray) -> None:
        """Discards every row of the masked keys (a faulty episode's data)."""
        for buffer in (self.rows, self.finals):
            if buffer.size:
                buffer.keep(np.flatnonzero(~key_mask[buffer.view()[KEY_COLUMN]]))

    def build(
        self, key_mask: np.ndarray, keys: KeyTable, unroll_id: int
    ) -> tuple[SampleBatch | None, np.ndarray, Segments]:
        """Turns the rows of the masked keys into transitions, in the order their opening
        rows were stored (time order within each trajectory).

        Returns the batch (None when no transition closed), the keys whose
        trajectories finished (to release), and the ``Segments`` of each key's
        transitions for per-trajectory post-processing.
        """
        if not self.size:
            return None, _NO_KEYS, _NO_SEGMENTS
        front, finals = self.rows.view(), self.finals.view()
        num_front = self.rows.size
        # Row indices below span both buffers: `rows` first, then `finals` (a trajectory's
        # final row comes after all its others, so time order holds within each key).
        all_keys = front[KEY_COLUMN]
        if self.finals.size:
            all_keys = np.concatenate([all_keys, finals[KEY_COLUMN]])
        plan = _plan_transitions(all_keys, key_mask[all_keys], num_front, keys.capacity)
        if plan is None:
            return None, _NO_KEYS, _NO_SEGMENTS
        if plan.opening is None:
            self._keep(plan.keep_front, plan.keep_finals, hand_off=False)
            return None, plan.finished, _NO_SEGMENTS
        num_rows = len(plan.opening)
        # The usual case: the opening rows are the first ones stored; the batch takes them
        # where they lie.
        in_place = bool(plan.opening[-1] == num_rows - 1)
        batch_keys = all_keys[plan.opening]
        final_rows = np.flatnonzero(plan.closing >= num_front)
        batch = self._transitions(
            front, finals, plan.opening, plan.closing, in_place, keys.capacity
        )
        # The build is where the process holds the most it ever does: the plan's row-sized
        # working arrays died with _plan_transitions, and these two go now.
        plan = plan._replace(opening=None, closing=None)
        self._keep(plan.keep_front, plan.keep_finals, hand_off=in_place)
        first_keys, first_rows = plan.first_keys, plan.first_rows
        batch["eps_id"] = keys.eps_id[batch_keys]
        batch["env_id"] = keys.env_id[batch_keys]
        batch["agent_index"] = keys.agent_index[batch_keys]
        if "agent_id" not in self.exclude:
            segment_of_key = np.empty(keys.capacity, np.intp)
            segment_of_key[first_keys] = np.arange(len(first_keys))
            # str() once per trajectory, spread over its rows (any hashable id: a tuple
            # one too, which astype(str) would take for a sequence).
            names = np.array([str(agent_id) for agent_id in keys.agent_id[first_keys]], str)
            batch["agent_id"] = names[segment_of_key[batch_keys]]
        if "unroll_id" not in self.exclude:
            batch["unroll_id"] = np.full(num_rows, unroll_id, np.int64)
        # A trajectory's first row here continues an earlier fragment's transitions, or not.
        continues = np.zeros(num_rows, bool)
        continues[first_rows] = keys.built[first_keys]
        batch[CONTINUES] = continues
        keys.built[first_keys] = True
        if "state_in_0" in batch:
            batch["seq_lens"] = np.ones(num_rows, np.int32)
        _add_rewards_after_done(batch, final_rows, batch_keys[final_rows], keys)
        if keys.capacity <= 1 << 16:  # held until post-processing is done: a quarter the bytes
            batch_keys = batch_keys.astype(np.uint16)
        return batch, plan.finished, Segments(batch_keys, keys.capacity)

    def _transitions(
        self,
        front: dict[str, np.ndarray],
        finals: dict[str, np.ndarray],
        opening: np.ndarray,
        closing: np.ndarray,
        in_place: bool,
        num_keys: int,
    ) -> SampleBatch:
        """The stored columns of the transitions: each from its opening row (views of the
        stored rows when ``in_place``), or its closing row (``CLOSING_COLUMNS``, and the
        paired ``new_`` columns)."""
        num_front = len(front[KEY_COLUMN])
        exclude = self.exclude
        gathered = {}
        for name, column in front.items():
            if name == KEY_COLUMN or name in exclude:
                continue
            if name in CLOSING_COLUMNS:
                gathered[name] = (column, finals.get(name))
            twin = PAIRED_COLUMNS.get(name)
            if twin is not None and twin not in exclude:
                gathered[twin] = (column, finals.get(name))
        out = allocate_columns(
            {
                name: (column.dtype, column.shape[1:])
                for name, (column, _) in gathered.items()
            },
            len(opening),
            self._blocks,
        )
        batch = SampleBatch()
        for name, column in front.items():
            if name == KEY_COLUMN or name in exclude:
                continue
            if name in CLOSING_COLUMNS:
                batch[name] = _gather(column, finals.get(name), closing, num_front, out[name])
            elif in_place:
                batch[name] = column[: len(opening)]
            else:
                batch[name] = take_rows(column, opening, None)
            twin = PAIRED_COLUMNS.get(name)
            if twin in gathered:
                batch[twin] = _gather(column, finals.get(name), closing, num_front, out[twin])
        return batch

    def _keep(self, keep_front: np.ndarray, keep_finals: np.ndarray, *, hand_off: bool) -> None:
        if hand_off:
            self.rows.hand_off(keep_front)
        else:
            self.rows.keep(keep_front)
        self.finals.keep(keep_finals)


def _gather(
    column: np.ndarray,
    final_column: np.ndarray | None,
    rows: np.ndarray,
    num_front: int,
    out: np.ndarray | None,
) -> np.ndarray:
    """``rows`` of the stored rows, ``column`` for those below ``num_front`` (there is at
    least one) and ``final_column`` (the final rows' column; zero where they lack it) for
    the others, into ``out`` (a new array when None)."""
    out = take_rows(column, np.minimum(rows, num_front - 1), out)
    in_finals = rows >= num_front
    if in_finals.any():
        if final_column is None:
            out[in_finals] = 0
        else:
            out[in_finals] = final_column[rows[in_finals] - num_front]
    return out


class _Plan(NamedTuple):
    """Which stored rows a build turns into transitions (``_plan_transitions``)."""

    finished: np.ndarray  # keys whose trajectories finished (to release)
    keep_front: np.ndarray  # rows of ``rows`` kept after the build: not built, or still open
    keep_finals: np.ndarray  # rows of ``finals`` kept (not built)
    opening: np.ndarray | None  # each transition's opening row, in stored order; None: none
    closing: np.ndarray | None  # each transition's closing row
    first_keys: np.ndarray | None  # the keys with transitions
    first_rows: np.ndarray | None  # each such key's first transition (batch row)


def _plan_transitions(
    all_keys: np.ndarray, selected: np.ndarray, num_front: int, num_keys: int
) -> _Plan | None:
    """The transitions of the ``selected`` rows (indices over both buffers, ``rows``
    first); None when no row is selected. Its row-sized working arrays die with it: the
    build is where the process holds the most it ever does."""
    if selected.all():
        chosen = None
    elif not selected.any():
        return None
    else:
        chosen = np.flatnonzero(selected)
    # Rows by key, time order kept within a key; ``order`` indexes the stored rows.
    row_keys = all_keys if chosen is None else all_keys[chosen]
    order = _stable_argsort(row_keys, num_keys)
    sorted_keys = row_keys[order]
    if chosen is not None:
        order = chosen[order]
    # Each key's rows are one group; all but a group's last row open a transition.
    opens = sorted_keys[:-1] == sorted_keys[1:]
    group_ends = np.append(np.flatnonzero(~opens), len(order) - 1)
    last_rows = order[group_ends]
    done = last_rows >= num_front
    finished = sorted_keys[group_ends[done]]
    # Kept: the last row of each unfinished trajectory, and every row not built.
    keep_front = last_rows[~done]
    keep_finals = np.zeros(0, np.intp)
    if chosen is not None:
        unselected = np.flatnonzero(~selected)
        keep_front = np.sort(np.concatenate([keep_front, unselected[unselected < num_front]]))
        keep_finals = unselected[unselected >= num_front] - num_front
    if not opens.any():
        return _Plan(finished, keep_front, keep_finals, None, None, None, None)
    # Opening rows in the order they were stored (no second sort): mark them, then read
    # each one's closing row from a table indexed by row.
    next_row = np.full(len(all_keys), -1, np.intp)
    next_row[order[:-1][opens]] = order[1:][opens]
    opening = np.flatnonzero(next_row >= 0)
    closing = next_row[opening]
    # A key's first transition opens on its group's first row (the groups are in time
    # order); ``opening`` is sorted, so that row's place in the batch is a binary search.
    group_starts = np.append(0, group_ends[:-1] + 1)
    with_transitions = group_starts < group_ends
    first_keys = sorted_keys[group_starts[with_transitions]]
    first_rows = np.searchsorted(opening, order[group_starts[with_transitions]])
    return _Plan(finished, keep_front, keep_finals, opening, closing, first_keys, first_rows)


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
