"""Per-step data between SubprocessVectorEnv and a worker through preallocated shared memory.

Pickling every step's actions, rewards, flags and infos costs both processes
more than many envs' steps. Instead each worker gets one block laid out from
`possible_agents` and each agent's spaces: per (sub-env, agent) a slot for
the obs and one for the action (Box of any dtype, Discrete, MultiDiscrete,
MultiBinary, Dict of those), a reward and the terminated/truncated flags
(`"__all__"` in one more slot), plus per sub-env codes saying which agents
each dict holds, in which order. Key tuples are numbered by the side that
writes them as they first appear; a new one travels pickled once, with the
message that first uses it, so both sides' tables stay equal.

`SlotBlock` writes and reads one sub-env at a time; messages whose sub-envs
all fit the common case go through in one pass instead (`shared_bulk`), with
the same block contents and results. A reply whose sub-envs all look alike
(same agents, no flag set, no infos) can also be read as one `StepBlock`
of arrays, without a dict per sub-env.

Whatever does not fit (an agent outside `possible_agents`, a value of
another shape, dtype or type, non-empty infos) sends that sub-env's whole
result (or the whole request) pickled instead, so what comes out always
equals what went in: same keys in the same order, equal values (rewards
come back as Python floats, or ints when the env gave ints; Discrete values
as Python ints; arrays as copies of the slot).
"""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing import shared_memory
from operator import itemgetter
from typing import Any

import numpy as np

from marl_runner.envs.multi_agent_env import AgentID, MultiAgentDict
from marl_runner.envs.reply_columns import ReplyColumns
from marl_runner.envs.shared_bulk import BulkReader, BulkWriter
from marl_runner.envs.shared_key_sets import KeySets
from marl_runner.envs.shared_values import SlotValues, codec_for
from marl_runner.envs.step_block import StepBlock

#: The largest block a worker lays out; beyond it every step is pickled.
MAX_BLOCK_BYTES = 1 << 30
_ALIGNMENT = 64
_ALL = "__all__"
# Per sub-env codes: obs, reward, terminated, truncated and infos key sets, reward kind,
# key set of the obs Dicts' key order (-1: not Dicts).
_OBS, _REW, _TERM, _TRUNC, _INFOS, _REW_KIND, _OBS_ORDER = range(7)
_FLOAT_REWARDS, _INT_REWARDS = 0, 1
# Value types that fit without a closer look (the others go through `_reward_kind`).
_PLAIN_FLOAT, _BOOLS, _DICT = {float}, {bool, np.bool_}, {dict}


class SlotLayout:
    """Where everything of one worker's sub-envs lies in its block; the same on both sides.

    Built from a picklable `spec` (agents, spaces, number of sub-envs) that
    the worker sends the parent with the block's name.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.agents: list[AgentID] = list(spec["agents"])
        num_envs = self.num_envs = spec["num_envs"]
        num_agents = len(self.agents)
        self.obs = SlotValues([codec_for(s) for s in spec["obs_spaces"]], num_envs)
        self.actions = SlotValues([codec_for(s) for s in spec["action_spaces"]], num_envs)
        plain = [
            ((num_envs, num_agents), np.float64),  # rewards
            ((num_envs, num_agents + 1), np.bool_),  # terminateds, "__all__" last
            ((num_envs, num_agents + 1), np.bool_),  # truncateds
            ((num_envs, 7), np.int32),  # result codes: key sets, reward kind, Dict order
            ((num_envs + 1,), np.int32),  # request: count, then local sub-env indices
            ((num_envs,), np.int32),  # request: actions' key set per sub-env
            ((2,), np.float64),  # reply: env_s, busy_s
        ]
        obs_specs, action_specs = self.obs.specs(), self.actions.specs()
        self.offsets: list[int] = []
        size = 0
        for shape, dtype in [*plain, *obs_specs, *action_specs]:
            size = -(-size // _ALIGNMENT) * _ALIGNMENT
            self.offsets.append(size)
            size += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.size = max(size, 1)
        self._shapes = [*plain, *obs_specs, *action_specs]
        self._num_plain = len(plain)
        self._num_obs = len(obs_specs)

    def bind(self, buffer: memoryview) -> None:
        """Views every slot array in `buffer`, so both sides work on the block in place."""
        arrays = [
            np.ndarray(shape, dtype, buffer=buffer, offset=offset)
            for (shape, dtype), offset in zip(self._shapes, self.offsets)
        ]
        (
            self.rewards,
            self.terminateds,
            self.truncateds,
            self.codes,
            self.request,
            self.action_sets,
            self.times,
        ) = arrays[: self._num_plain]
        rest = arrays[self._num_plain :]
        self.obs.bind(rest[: self._num_obs])
        self.actions.bind(rest[self._num_obs :])

    def release(self) -> None:
        """Drop every view of the block, so that it can be closed."""
        for name in (
            "rewards", "terminateds", "truncateds", "codes", "request", "action_sets", "times"
        ):
            self.__dict__.pop(name, None)
        self.obs.arrays = []
        self.actions.arrays = []


def layout_spec(env: Any, num_envs: int) -> dict[str, Any] | None:
    """The layout spec of a worker running `num_envs` sub-envs like `env`, or None
    when its agents or spaces cannot be read or the block would be too big."""
    try:
        agents = list(env.possible_agents)
        spec = {
            "agents": agents,
            "obs_spaces": [env.get_observation_space(a) for a in agents],
            "action_spaces": [env.get_action_space(a) for a in agents],
            "num_envs": num_envs,
        }
        if not agents or SlotLayout(spec).size > MAX_BLOCK_BYTES:
            return None
    except Exception:
        return None
    return spec


class SlotBlock:
    """One side's handle on a worker's block: the layout bound to the shared memory and
    the key sets this side has written (`out_sets`) and read (`in_sets`)."""

    def __init__(self, spec: dict[str, Any], memory: shared_memory.SharedMemory) -> None:
        self.layout = SlotLayout(spec)
        self.memory = memory
        self.layout.bind(memory.buf)
        self.out_sets = KeySets(self.layout.agents)
        self.in_sets = KeySets(self.layout.agents)
        #: Key sets numbered here but not sent yet (the next message carries them).
        self.unsent: list[tuple[int, tuple]] = []
        #: The result codes this side last wrote per sub-env (the block's, unchanged since).
        self.written_codes: list[list[int] | None] = [None] * self.layout.num_envs
        self._bulk_writer = BulkWriter(self)
        self._bulk_reader = BulkReader(self)

    @classmethod
    def create(cls, spec: dict[str, Any], name: str | None) -> SlotBlock:
        """The worker's side: make the block (named `name`, so a killer can free it)."""
        size = SlotLayout(spec).size
        return cls(spec, shared_memory.SharedMemory(name=name, create=True, size=size))

    @classmethod
    def attach(cls, spec: dict[str, Any], name: str) -> SlotBlock:
        """The parent's side: bind to the worker's block."""
        return cls(spec, shared_memory.SharedMemory(name=name))

    @property
    def name(self) -> str:
        """The shared-memory name, so the parent can tell whether a reply names a new block."""
        return self.memory.name

    def close(self, unlink: bool = False) -> None:
        """Drops the views first (else the memory cannot close); `unlink` frees the block."""
        self.layout.release()
        self.memory.close()
        if unlink:
            try:
                self.memory.unlink()
            except FileNotFoundError:
                pass

    # ---- parent: actions out, results in

    def write_request(
        self, local: dict[int, int], request: Sequence[tuple[int, MultiAgentDict]]
    ) -> bool:
        """Put a step request in the block (`local`: env_id -> index in this worker);
        False if an action does not fit. Key sets it numbered wait in `unsent`."""
        if self._bulk_writer.request(
            list(map(local.__getitem__, map(itemgetter(0), request))),
            list(map(itemgetter(1), request)),
        ):
            return True
        layout = self.layout
        sets = self.out_sets
        new = self.unsent
        agent_slots, index = sets.agent_slots, sets.index
        write = layout.actions.write
        envs, numbers = [], []
        for env_id, actions in request:
            env = local[env_id]
            number = sets.id_of(tuple(actions), new)
            slots = agent_slots[number] if number >= 0 else None
            if slots is None or not write(env, slots, index[number], list(actions.values())):
                return False
            envs.append(env)
            numbers.append(number)
        layout.request[: len(envs) + 1] = [len(envs), *envs]
        layout.action_sets[envs] = numbers
        return True

    def take_unsent(self) -> list[tuple[int, tuple]]:
        """Key sets the next message must carry, so the worker numbers them as we do."""
        unsent, self.unsent = self.unsent, []
        return unsent

    def read_results(self) -> tuple[Any, list, list, list, list]:
        """Copies of every result slot, taken once per reply."""
        layout = self.layout
        return (
            layout.obs.snapshot(),
            layout.rewards.tolist(),
            layout.terminateds.tolist(),
            layout.truncateds.tolist(),
            layout.codes.tolist(),
        )

    def step_block(self, envs: list[int], env_ids: list[int]) -> StepBlock | None:
        """The step results of sub-envs `envs` (`env_ids` their global ids) as one
        `StepBlock`, when they all look alike (see `BulkReader.step_block`); else None."""
        return self._bulk_reader.step_block(envs, env_ids)

    def columns(self, copies: tuple, envs: list[int]) -> tuple[list, ...]:
        """The step results of sub-envs `envs` as `(obs, rewards, terminateds, truncateds,
        infos)`, one dict per sub-env in each: the whole reply in one pass where it can."""
        columns = self._bulk_reader.results(copies, envs)
        if columns is None:
            columns = tuple(map(list, zip(*self.results(copies, envs)))) or ([],) * 5
        return columns

    def result(self, copies: tuple, env: int) -> list:
        """Sub-env `env`'s step result `[obs, rewards, terminateds, truncateds, infos]`."""
        return self.results(copies, (env,))[0]

    def results(self, copies: tuple, envs: Sequence[int]) -> list[list]:
        """The step results of sub-envs `envs`, in one pass (the parent's hot path)."""
        obs_copy, rewards, terminateds, truncateds, codes = copies
        sets = self.in_sets
        keys, slots, prefix = sets.keys, sets.slots, sets.prefix
        values_of = self.layout.obs
        read = values_of.read
        uniform = values_of.uniform
        out = []
        for env in envs:
            obs_n, rew_n, term_n, trunc_n, infos_n, rew_kind, order_n = codes[env]
            if uniform and prefix[obs_n]:
                obs = dict(zip(keys[obs_n], obs_copy[env]))  # zip stops at the last key
            else:
                order = keys[order_n] if order_n >= 0 else None
                obs = read(obs_copy, env, slots[obs_n], keys[obs_n], order, prefix[obs_n])
            row = rewards[env]
            values = row if prefix[rew_n] else [row[s] for s in slots[rew_n]]
            if rew_kind == _INT_REWARDS:
                values = [int(v) for v in values]
            row = terminateds[env]
            term = dict(zip(keys[term_n], row if prefix[term_n] else [row[s] for s in slots[term_n]]))
            row = truncateds[env]
            trunc = dict(
                zip(keys[trunc_n], row if prefix[trunc_n] else [row[s] for s in slots[trunc_n]])
            )
            infos = {key: {} for key in keys[infos_n]}
            out.append([obs, dict(zip(keys[rew_n], values)), term, trunc, infos])
        return out

    # ---- worker: actions in, results out

    def read_actions(self) -> tuple[list[int], list[MultiAgentDict]]:
        """The step request in the block: the local indices of its sub-envs, in order, and
        their actions (the worker's hot path: one pass where all share one key set)."""
        layout = self.layout
        request = layout.request.tolist()
        envs = request[1 : request[0] + 1]
        values_of = layout.actions
        if values_of.uniform and values_of.codecs[0].scalar:
            snapshot = values_of.arrays[0].tolist()  # Python ints: a copy in one call
        else:
            snapshot = values_of.snapshot()
        numbers = list(map(layout.action_sets.tolist().__getitem__, envs))
        if values_of.uniform:
            actions = self._bulk_reader.request(snapshot, envs, numbers)
            if actions is not None:
                return envs, actions
        sets = self.in_sets
        slots, keys, prefix = sets.slots, sets.keys, sets.prefix
        read = values_of.read
        return envs, [
            read(snapshot, env, slots[n], keys[n], None, prefix[n])
            for env, n in zip(envs, numbers)
        ]

    def write_results(
        self,
        envs: list[int],
        results: Sequence[Sequence[Any]],
        columns: ReplyColumns | None = None,
    ) -> bool:
        """Put the step results of sub-envs `envs` in the block at once (`columns`: theirs,
        where the caller has them); False: none of them is, write them one by one
        (`write_result`)."""
        if not results:
            return False
        return self._bulk_writer.reply(envs, ReplyColumns(results) if columns is None else columns)

    def write_result(self, env: int, result: Sequence[Any], new: list[tuple[int, tuple]]) -> bool:
        """Put a step result in the block; False (write it pickled) if part does not fit.

        The hot path of every step: key sets are looked up without a call where
        known, and a rewards dict with the obs' keys reuses their key set."""
        obs, rewards, terminateds, truncateds, infos = result
        layout = self.layout
        sets = self.out_sets
        known = sets.ids
        agent_slots, index = sets.agent_slots, sets.index
        keys = tuple(obs)
        number = known.get(keys)
        if number is None:
            number = sets.id_of(keys, new)
        slots = agent_slots[number] if number >= 0 else None
        if slots is None:
            return False
        code = [number, number, 0, 0, 0, 0, -1]
        values = list(obs.values())
        order = None
        if values and type(values[0]) is dict:
            order = tuple(values[0])
            code[_OBS_ORDER] = sets.id_of(order, new)
            if code[_OBS_ORDER] < 0:
                return False
        if not layout.obs.write(env, slots, index[number], values, order):
            return False
        reward_keys = tuple(rewards)
        if reward_keys != keys:
            number = code[_REW] = sets.id_of(reward_keys, new)
            if number < 0 or agent_slots[number] is None:
                return False
        values = list(rewards.values())
        if not set(map(type, values)) <= _PLAIN_FLOAT:
            kind = _reward_kind(values)
            if kind is None:
                return False
            code[_REW_KIND] = kind
        layout.rewards[env][index[number]] = values
        for at, flags, array in (
            (_TERM, terminateds, layout.terminateds),
            (_TRUNC, truncateds, layout.truncateds),
        ):
            flag_keys = tuple(flags)
            number = known.get(flag_keys)
            if number is None:
                number = sets.id_of(flag_keys, new)
            if number < 0 or sets.slots[number] is None:
                return False
            code[at] = number
            values = list(flags.values())
            if not set(map(type, values)) <= _BOOLS:
                return False
            array[env][index[number]] = values
        if any(infos.values()) or not set(map(type, infos.values())) <= _DICT:
            return False
        info_keys = tuple(infos)
        number = code[_OBS] if info_keys == keys else sets.id_of(info_keys, new)
        if number < 0:
            return False
        code[_INFOS] = number
        if code != self.written_codes[env]:  # usually the same key sets as last step: no write
            layout.codes[env] = code
            self.written_codes[env] = code
        return True


def _reward_kind(values: list[Any]) -> int | None:
    """Whether the rewards are all Python ints (kept as ints), else numbers (floats);
    None when one is neither, or an int too big for a float64 to hold exactly."""
    if all(type(v) is int for v in values):
        return _INT_REWARDS if all(-(2**53) <= v <= 2**53 for v in values) else None
    for v in values:
        if not (type(v) is float or isinstance(v, int | np.floating | np.integer)):
            return None
    return _FLOAT_REWARDS
