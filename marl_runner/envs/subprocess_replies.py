"""SubprocessVectorEnv's replies from its workers, entered until they are handed out:
step results for the next poll (a reply whose sub-envs all look alike as one `StepBlock`,
in `BaseEnv.poll_blocks`' form), reset results for `try_reset`, bad output to raise."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Any

from marl_runner.envs.base_env import EnvID, PollDicts, put_failure, put_reset
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentDict
from marl_runner.envs.shared_obs import SharedObs, SharedObsReader
from marl_runner.envs.step_block import BlockRow, StepBlock
from marl_runner.envs.subprocess_pool import InFlight, SubprocessStats, WorkerHandle
from marl_runner.envs.subprocess_protocol import DONE, Crash, Malformed
from marl_runner.envs.subprocess_restarts import RestartBook


class Replies:
    """What the workers answered and the caller has not taken yet."""

    def __init__(self, restarts: RestartBook) -> None:
        self.restarts = restarts
        #: Results read but not yet returned by `poll`.
        self.ready: PollDicts = empty_poll()
        #: Reset results (obs already copied out) sent with an episode's last step.
        self.prefetched: dict[EnvID, Any] = {}
        #: Replies to reset requests, until `try_reset` takes them.
        self.reset_replies: dict[EnvID, Any] = {}
        #: Bad output found while reading this round's replies (restarts off), per sub-env:
        #: poll raises the first in the round's order.
        self.bad_output: dict[EnvID, EnvError] = {}

    def take(self, order: Iterable[EnvID] | None = None) -> PollDicts:
        """This round's results in `poll_blocks`' form (sub-envs in `order` if given,
        whatever order their replies came in); raises the bad output found instead
        (keeping the results)."""
        if self.bad_output:
            bad, self.bad_output = self.bad_output, {}
            first = next((env_id for env_id in order or () if env_id in bad), next(iter(bad)))
            raise bad[first]
        poll, self.ready = self.ready, empty_poll()
        return poll if order is None else in_order(poll, order)

    def drop_step_result(self, env_id: EnvID) -> None:
        """The sub-env was reset: a step result of it read but not handed out is stale."""
        for part in self.ready:
            part.pop(env_id, None)

    def forget(self, env_ids: list[EnvID]) -> None:
        """Drop what recreated sub-envs' old envs answered."""
        for env_id in env_ids:
            self.prefetched.pop(env_id, None)
            self.reset_replies.pop(env_id, None)

    def enter(
        self, worker: WorkerHandle, in_flight: InFlight, reply: Any, stats: SubprocessStats
    ) -> None:
        """Enter one reply; may run twice for one reply (after an interruption), so
        it only assigns."""
        kind = in_flight.kind
        if kind in ("restart", "render"):
            worker.reply = reply
            return
        if kind == "step":
            self._enter_step(worker, in_flight, reply, stats)
            return
        new_block_name, results = reply
        reader = worker.obs_reader
        _attach_if_new(reader, new_block_name)
        for (env_id, *_), result in zip(in_flight.request, results):
            if type(result) is tuple and type(result[0]) is SharedObs:
                result = (reader.unpack(result[0]), result[1])
            if kind == "reset":
                self.reset_replies[env_id] = result
            else:
                put_reset(self.ready, env_id, *self.reset_outcome(env_id, result, raise_bad=False))

    def _enter_step(
        self, worker: WorkerHandle, in_flight: InFlight, reply: Any, stats: SubprocessStats
    ) -> None:
        """A step reply: results in the slot block (all of them for `DONE`, else those
        whose entry is None) or pickled; resets sent with episode ends kept for try_reset.
        The sub-envs in the block whose episode goes on come as one `StepBlock`'s rows
        where they look alike (also beside pickled parts), the others as dicts."""
        slots = worker.slots
        if reply is DONE:
            new_block_name, results, resets, new_sets = None, None, {}, ()
            env_s, busy_s = slots.layout.times.tolist()
        else:
            new_block_name, results, resets, new_sets, env_s, busy_s = reply
            stats.pickled_step_messages += 1
            stats.pickled_env_steps += sum(result is not None for result in results)
        reader = worker.obs_reader
        _attach_if_new(reader, new_block_name)
        for number, keys in new_sets:
            slots.in_sets.learn(number, keys)
        stats.worker_env_s += env_s
        stats.worker_busy_s += busy_s
        stats.env_steps += len(in_flight.request)
        obs, rewards, terminateds, truncateds, infos, off_policy_actions = self.ready
        local = worker.local
        if results is None:  # every result in the block: read in one pass
            env_ids = [env_id for env_id, _ in in_flight.request]
            envs = [local[env_id] for env_id in env_ids]
            block = slots.step_block(envs, env_ids)
            if block is not None:
                self._enter_block(block)
                return
            columns = slots.columns(slots.read_results(), envs)
            for part, column in zip((obs, rewards, terminateds, truncateds, infos), columns):
                part.update(zip(env_ids, column))
            off_policy_actions.update(zip(env_ids, map(dict, repeat((), len(env_ids)))))
            return
        in_block = results.count(None)
        block_rows = (
            _rows_of_unended(slots, in_flight.request, results, resets, local) if in_block else {}
        )
        self._drop_dict_entries(block_rows)
        copies = slots.read_results() if in_block > len(block_rows) else None
        for (env_id, _), result in zip(in_flight.request, results):
            row = block_rows.get(env_id)
            if row is not None:
                obs[env_id] = row  # in request order, like the sub-envs read apart
                continue
            if result is None:
                result = slots.result(copies, local[env_id])
            if type(result) is list:
                env_obs = result[0]
                if type(env_obs) is SharedObs:
                    env_obs = reader.unpack(env_obs)
                obs[env_id] = env_obs
                rewards[env_id] = result[1]
                terminateds[env_id] = result[2]
                truncateds[env_id] = result[3]
                infos[env_id] = result[4]
                off_policy_actions[env_id] = {}
            else:
                put_failure(self.ready, env_id, self.failure(env_id, result, raise_bad=False))
        for env_id, result in resets.items():
            if type(result) is tuple and type(result[0]) is SharedObs:
                result = (reader.unpack(result[0]), result[1])
            self.prefetched[env_id] = result

    def _enter_block(self, block: StepBlock) -> None:
        """A reply read as one StepBlock: a `BlockRow` per sub-env as its obs entry and
        nothing in the other five dicts (`poll_blocks`' form), dropping what an earlier
        reply of the same sub-envs left there."""
        self.ready[0].update(zip(block.env_ids, block.rows()))
        self._drop_dict_entries(block.env_ids)

    def _drop_dict_entries(self, env_ids: Iterable[EnvID]) -> None:
        """What an earlier reply of sub-envs now given as `BlockRow`s left in the other
        five dicts (a block row has no entry there)."""
        for part in self.ready[1:]:
            if part and not part.keys().isdisjoint(env_ids):
                for env_id in env_ids:
                    part.pop(env_id, None)

    def fail(self, env_id: EnvID, error: Exception) -> None:
        """Enter a failure of `env_id` into the next poll's results."""
        put_failure(self.ready, env_id, self.failure(env_id, Crash(error)))

    def reset_outcome(
        self, env_id: EnvID, result: Any, raise_bad: bool = True
    ) -> tuple[MultiAgentDict | Exception, MultiAgentDict]:
        """A reset reply as `(obs, infos)` or its failure, so every reset path reports alike."""
        if type(result) is tuple:
            return result
        return self.failure(env_id, result, raise_bad), {}

    def failure(
        self, env_id: EnvID, result: Crash | Malformed, raise_bad: bool = True
    ) -> Exception:
        """The Exception entry for a failed sub-env.

        Bad output without restarts is raised: at once (`raise_bad`), or by
        the poll that is reading this round's replies.
        """
        self.restarts.failed(env_id)
        if isinstance(result, Crash):
            return result.error
        error = EnvError(result.message)
        if not self.restarts.restart_failed:
            if raise_bad:
                raise error
            self.bad_output.setdefault(env_id, error)
        return error


def _rows_of_unended(
    slots: Any, request: list, results: list, resets: dict, local: dict[EnvID, int]
) -> dict[EnvID, BlockRow]:
    """`BlockRow`s of the sub-envs of a reply that are in the slot block and whose
    episode did not end (an ended one was reset, its reset pickled with the reply), when
    they look alike: one episode end in a worker's sub-envs leaves the others' rows
    on the runner's fast path. Empty when they do not fit one `StepBlock`."""
    env_ids = [
        env_id
        for (env_id, _), result in zip(request, results)
        if result is None and env_id not in resets
    ]
    if not env_ids:
        return {}
    block = slots.step_block([local[env_id] for env_id in env_ids], env_ids)
    return {} if block is None else dict(zip(env_ids, block.rows()))


def _attach_if_new(reader: SharedObsReader, block_name: str | None) -> None:
    """Attach to the worker's obs block when a reply names a new one."""
    if block_name is not None and (
        reader.block is None or reader.block.name.lstrip("/") != block_name.lstrip("/")
    ):
        reader.attach(block_name)


def in_order(poll: PollDicts, order: Iterable[EnvID]) -> PollDicts:
    """`poll` with its sub-envs in `order` (those not in it last, as they were)."""
    keys = list(poll[0])
    wanted = [env_id for env_id in order if env_id in poll[0]]
    if keys == wanted:
        return poll
    rank = {env_id: n for n, env_id in enumerate(wanted)}
    keys.sort(key=lambda env_id: rank.get(env_id, len(rank)))
    # A sub-env with a BlockRow obs has no entry in the other five dicts.
    return tuple({env_id: part[env_id] for env_id in keys if env_id in part} for part in poll)


def empty_poll() -> PollDicts:
    return ({}, {}, {}, {}, {}, {})
