"""The least-work loop: the bare loop plus what any sampler that hands out batches adds.

The bare loop only acts. A sampler that hands out training batches must also
read each agent's reward and info, keep every row it acted on, and pair each
row with what came after it. This loop does that on top of the bare loop, the
fastest way we wrote it in Python, and nothing else, so its ratio to the bare
loop is a ceiling for the runner's on the same env API (per-env dicts): a
target above it is above what a sampler of these batches reaches here.

What it adds, per round:

- per sub-env whose reward dict names exactly its observing agents and whose
  agents that end all observe: each policy group's obs, rewards and infos read
  with one C-level ``itemgetter`` (as the runner's fast path), the ending
  agents' rows marked; else agent by agent;
- per policy: the log-prob of each action drawn, and 11 columns (obs, actions,
  log-probs, values, logits, rewards, two flags, ``t``, sub-env, agent index)
  written into arrays that grow by doubling;
- every ``rollout_fragment_length`` rounds, each policy's batch as the runner
  hands it out: the rows in the order they were stored (views, no copy), and
  the closing side (``new_obs``, rewards, flags) gathered from each row's next
  row in its trajectory (one stable argsort finds them).

What it leaves out, so that it flatters itself: connectors, episode objects,
fake final obs, rewards of agents that do not observe, checks, six of the
runner's columns (``agent_id``, ``eps_id``, ``unroll_id``, ``policy_version``,
``env_t``, ``continues``), rows still open at a batch's end (handed out
with the rest), and ``t`` resets (a running count per sub-env and agent).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat
from operator import itemgetter
from time import perf_counter
from typing import Any

import numpy as np

from marl_runner.bench.bare_loop import BareLoop, RunResult
from marl_runner.config import RunnerConfig

_NOTHING: dict = {}
_MAX_LAYOUTS = 4096


def _ending(terminateds: dict, truncateds: dict) -> frozenset:
    """The agents flagged in either dict (read in C when none is)."""
    if not (any(terminateds.values()) or any(truncateds.values())):
        return frozenset()
    flagged = {*compress(terminateds.keys(), terminateds.values())}
    flagged.update(compress(truncateds.keys(), truncateds.values()))
    flagged.discard("__all__")
    return frozenset(flagged)


class _Rows:
    """One policy's rows of one round, in the order they were read."""

    __slots__ = ("obs", "rewards", "infos", "keys", "acting", "done", "runs")

    def __init__(self) -> None:
        self.obs: list = []
        self.rewards: list = []
        self.infos: list = []
        self.keys: list[int] = []  # sub-env * agents + agent index
        self.acting: list[tuple[int, int, Any]] = []  # (row, sub-env, agent) read one by one
        self.done: list[int] = []  # rows that end their agent's trajectory
        self.runs: list[tuple[int, int, tuple]] = []  # (first row, sub-env, agents) read a group at once


class _Store:
    """One policy's stored columns since its last batch."""

    def __init__(self) -> None:
        self.columns: dict[str, np.ndarray] = {}
        self.size = 0
        self.keys: list[int] = []
        self.infos: list = []

    def add(self, columns: dict[str, np.ndarray], keys: list[int], infos: list) -> None:
        rows = len(keys)
        if not self.columns:
            self.columns = {
                name: np.empty((max(4 * rows, 1024), *c.shape[1:]), c.dtype) for name, c in columns.items()
            }
        while self.size + rows > len(self.columns["obs"]):
            self.columns = {name: np.concatenate([a, np.empty_like(a)]) for name, a in self.columns.items()}
        for name, column in columns.items():
            self.columns[name][self.size : self.size + rows] = column
        self.keys.extend(keys)
        self.infos.extend(infos)
        self.size += rows

    def build(self) -> dict[str, Any]:
        """The rows as the runner hands them out, views of the store's arrays, which the next
        rows reuse (the loop drops each batch at once, as a trainer does before sampling on)."""
        size = self.size
        order = np.argsort(np.asarray(self.keys), kind="stable")
        sorted_keys = np.asarray(self.keys)[order]
        same = sorted_keys[1:] == sorted_keys[:-1]
        following = np.arange(size)  # each row's next row in its trajectory (itself if none)
        following[order[:-1][same]] = order[1:][same]
        batch: dict[str, Any] = {name: column[:size] for name, column in self.columns.items()}
        batch["new_obs"] = batch["obs"].take(following, axis=0)
        for name in ("rewards", "terminateds", "truncateds"):
            batch[name] = batch[name].take(following)
        batch["infos"] = self.infos
        self.size, self.keys, self.infos = 0, [], []
        return batch


class LeastWorkLoop(BareLoop):
    """The bare loop over its own vector env, plus a batch's bookkeeping (numpy forward)."""

    def __init__(self, config: RunnerConfig) -> None:
        super().__init__(config, forward="numpy")
        self._index = {agent: i for i, agent in enumerate(self.env.possible_agents)}
        self._stores = {pid: _Store() for pid in self.policies}
        self._t = np.zeros(self.env.num_envs * len(self._index), np.int64)
        self._layouts: dict[tuple, list[tuple[str, tuple, Callable, list[int]]]] = {}
        self._rounds = 0
        self.rows_built = 0  # rows of every batch built so far

    def run(self, *, duration_s: float = 0.0, min_rounds: int = 1) -> RunResult:
        """Rounds until ``duration_s`` passed and at least ``min_rounds`` were done, ending
        at a batch."""
        result = RunResult()
        env = self.env
        length = self.config.rollout_fragment_length
        start = perf_counter()
        while True:
            if self._started:
                env.send_actions(self._pending)
            self._started = True
            obs, rewards, terminateds, truncateds, infos, _ = env.poll()
            rows = {pid: _Rows() for pid in self.policies}
            actions: dict[int, dict] = {}
            for env_id, env_obs in obs.items():
                if isinstance(env_obs, BaseException):
                    raise RuntimeError(f"sub-env {env_id} failed in the least-work loop") from env_obs
                env_obs = self._read_env(
                    rows, actions, env_id, env_obs, rewards.get(env_id) or _NOTHING,
                    terminateds[env_id], truncateds[env_id], infos.get(env_id) or _NOTHING, result,
                )
                if env_obs is not None:
                    self._read_groups(rows, env_id, *env_obs)
            for pid, policy_rows in rows.items():
                if policy_rows.keys:
                    result.agent_steps += self._act_and_store(pid, policy_rows, actions)
            self._pending = actions
            self._rounds += 1
            result.rounds += 1
            if self._rounds % length == 0:
                for store in self._stores.values():
                    if store.size:
                        self.rows_built += len(store.build()["obs"])
                if result.rounds >= min_rounds and perf_counter() - start >= duration_s:
                    break
        result.elapsed_s = perf_counter() - start
        # Its arrays go, so that the runner's windows between its own measure no memory of it.
        self._stores = {pid: _Store() for pid in self.policies}
        return result

    def _read_env(
        self, rows: dict[str, _Rows], actions: dict[int, dict], env_id: int, env_obs: dict,
        env_rewards: dict, env_terminateds: dict, env_truncateds: dict, env_infos: dict,
        result: RunResult,
    ) -> tuple[dict, dict | None, dict, frozenset] | None:
        """Reads a sub-env agent by agent when it has to; returns what is left to read a
        group at a time: ``(obs, rewards, infos, agents ending)`` (the reset obs of an
        episode that ended)."""
        actions[env_id] = {}
        over = env_terminateds["__all__"] or env_truncateds["__all__"]
        if not over and env_rewards.keys() == env_obs.keys():
            ending = _ending(env_terminateds, env_truncateds)
            if ending <= env_obs.keys():
                result.env_steps += 1
                return env_obs, env_rewards, env_infos, ending
        base = env_id * len(self._index)
        for agent_id, agent_obs in env_obs.items():
            policy_rows = rows[self._policy_of.get(agent_id) or self._lookup(agent_id)]
            row = len(policy_rows.keys)
            policy_rows.obs.append(agent_obs)
            policy_rows.rewards.append(env_rewards.get(agent_id, 0.0))
            policy_rows.infos.append(env_infos.get(agent_id, _NOTHING))
            policy_rows.keys.append(base + self._index[agent_id])
            if over or env_terminateds.get(agent_id) or env_truncateds.get(agent_id):
                policy_rows.done.append(row)
            else:
                policy_rows.acting.append((row, env_id, agent_id))
        if not over:
            result.env_steps += 1
            return None
        result.episodes += 1
        reset = self.env.try_reset(env_id)
        if reset is None:  # an asynchronous reset: its obs come in a later poll
            del actions[env_id]
            return None
        if isinstance(reset[0], BaseException):
            raise RuntimeError(f"sub-env {env_id} failed to reset") from reset[0]
        return reset[0], None, reset[1] or _NOTHING, frozenset()

    def _read_groups(
        self, rows: dict[str, _Rows], env_id: int, env_obs: dict, env_rewards: dict | None,
        env_infos: dict, ending: frozenset,
    ) -> None:
        """Each policy group's obs, rewards and infos, one ``itemgetter`` call each; the
        rows of agents ``ending`` marked done."""
        names = tuple(env_obs)
        layout = self._layouts.get(names)
        if layout is None:
            if len(self._layouts) >= _MAX_LAYOUTS:  # agents dying make new ones
                self._layouts.clear()
            layout = self._layouts[names] = self._layout(names)
        base = env_id * len(self._index)
        infos_whole = env_infos.keys() == env_obs.keys()
        for pid, agent_ids, read, offsets in layout:
            policy_rows = rows[pid]
            first = len(policy_rows.keys)
            if ending:
                done = [first + i for i, agent_id in enumerate(agent_ids) if agent_id in ending]
                policy_rows.done.extend(done)
                policy_rows.acting.extend(
                    (first + i, env_id, agent_id)
                    for i, agent_id in enumerate(agent_ids)
                    if agent_id not in ending
                )
            else:
                policy_rows.runs.append((first, env_id, agent_ids))
            policy_rows.obs.extend(read(env_obs))
            policy_rows.rewards.extend(read(env_rewards) if env_rewards else repeat(0.0, len(agent_ids)))
            policy_rows.infos.extend(read(env_infos) if infos_whole else repeat(_NOTHING, len(agent_ids)))
            policy_rows.keys.extend([base + offset for offset in offsets])

    def _layout(self, names: tuple) -> list[tuple[str, tuple, Callable, list[int]]]:
        """Per policy: its agents among ``names``, their reader, their agent indices."""
        groups: dict[str, list] = {}
        for agent_id in names:
            groups.setdefault(self._policy_of.get(agent_id) or self._lookup(agent_id), []).append(agent_id)
        return [
            (pid, tuple(ids), itemgetter(*ids) if len(ids) > 1 else (lambda d, a=ids[0]: (d[a],)),
             [self._index[a] for a in ids])
            for pid, ids in groups.items()
        ]

    def _act_and_store(self, pid: str, rows: _Rows, actions: dict[int, dict]) -> int:
        """One forward pass and draw over the policy's rows, their log-probs, the columns
        stored, the actions spread into ``actions``; returns the actions sent."""
        policy = self.policies[pid]
        obs, mask = policy.prepare(rows.obs)
        chosen, logits, values = policy.draw(obs, mask)
        top = logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        logp = logits[np.arange(len(chosen)), chosen - policy.start] - log_norm
        keys = np.asarray(rows.keys)
        t = self._t[keys]
        self._t[keys] += 1
        done = np.zeros(len(keys), bool)
        done[rows.done] = True
        num_agents = len(self._index)
        self._stores[pid].add(
            {
                "obs": obs, "actions": chosen, "action_logp": logp, "vf_preds": values.reshape(-1),
                "action_dist_inputs": logits, "rewards": np.asarray(rows.rewards, np.float32),
                "terminateds": done, "truncateds": done, "t": t, "env_id": keys // num_agents,
                "agent_index": keys % num_agents,
            },
            rows.keys,
            rows.infos,
        )
        sent = chosen.tolist()
        for row, env_id, agent_id in rows.acting:
            actions[env_id][agent_id] = sent[row]
        for first, env_id, agent_ids in rows.runs:
            actions[env_id].update(zip(agent_ids, sent[first : first + len(agent_ids)]))
        return len(rows.acting) + sum(len(ids) for _, _, ids in rows.runs)
