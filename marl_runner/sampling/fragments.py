"""When a fragment is due, and building it from the trajectory stores.

``truncate_episodes``: a sub-env's fragment is due when the steps counted
since its last fragment reach ``rollout_fragment_length`` (by env steps a
fragment is exactly that long). ``complete_episodes``: one fragment per
finished episode, built as soon as the episode's last rows are stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.sampling.episode import MultiAgentEpisode
from marl_runner.sampling.trajectories import KeyTable, PolicyTrajectories, Segments

Postprocess = Callable[[dict[str, tuple[SampleBatch, Segments]]], dict[str, SampleBatch]]


class FragmentBuilder:
    """Step counts per sub-env, the per-policy trajectory stores, and fragment building."""

    def __init__(
        self,
        num_envs: int,
        rollout_fragment_length: int,
        *,
        truncate_episodes: bool,
        count_agent_steps: bool,
        key_table: KeyTable,
        exclude_columns: Callable[[str], frozenset[str]] | None = None,
    ) -> None:
        # Per policy: the batch columns its store leaves out.
        self._exclude = exclude_columns or (lambda policy_id: frozenset())
        self._length = rollout_fragment_length
        self._truncate = truncate_episodes
        self._count_agent_steps = count_agent_steps
        self._keys = key_table
        self.stores: dict[str, PolicyTrajectories] = {}
        # Per sub-env counts, one row each, so that one copy keeps them as a round found them.
        self._counts = np.zeros((5, num_envs), np.int64)
        (
            self._env_steps,  # since the sub-env's last fragment
            self._agent_steps,
            self._episode_steps,  # of the running episode, unbuilt
            self._episode_agent_steps,  # of the episode whose rows the round stores, unbuilt
            self._episodes_ended,  # since the last fragment
        ) = self._counts
        self._counts_at_round_start = self._counts.copy()
        # Episodes that ended or were dropped in this round (see `undo_round`).
        self._finished_in_round: list[MultiAgentEpisode] = []
        self._episodes_to_build: list[tuple[MultiAgentEpisode, int]] = []
        self._built_before_error: list[MultiAgentBatch] = []
        self._unroll_id = 0
        self.built_episodes = 0
        self.fragments_per_env = np.zeros(num_envs, np.int64)

    # ---- counting

    def begin_round(self) -> None:
        """Keeps the counts as a runner step finds them, for `undo_round`. An episode that
        ended in the last round had its last agent steps counted after it ended (the store
        comes after the episode ends): only now does its sub-env's episode count restart."""
        finished = self._finished_in_round
        if finished:
            self._episode_agent_steps[[episode.env_id for episode in finished]] = 0
            self._finished_in_round = []
        np.copyto(self._counts_at_round_start, self._counts)

    def count_env_steps(self, env_ids: np.ndarray) -> None:
        """One env step for each listed sub-env, listed once (towards its fragment and its
        episode)."""
        self._env_steps[env_ids] += 1
        self._episode_steps[env_ids] += 1

    def add_rows(
        self,
        policy_id: str,
        chunk: dict[str, Any],
        num_rows: int,
        env_ids: np.ndarray,
        closing: np.ndarray,
    ) -> None:
        """Stores a policy's rows of one round (a 0-d column is that value on every row);
        each row marked ``closing`` is an agent step of its sub-env (``env_ids``)."""
        store = self.stores.get(policy_id)
        if store is None:
            store = self.stores[policy_id] = PolicyTrajectories(policy_id, self._exclude(policy_id))
        store.add(chunk, num_rows)
        if self._count_agent_steps:
            closing_env_ids = env_ids[closing]
            if len(closing_env_ids):
                counts = np.bincount(closing_env_ids, minlength=len(self._agent_steps))
                self._agent_steps += counts
                self._episode_agent_steps += counts

    # ---- episodes

    def episode_ended(self, episode: MultiAgentEpisode) -> None:
        """Counts the ended episode; in ``complete_episodes`` mode queues its fragment."""
        env_id = episode.env_id
        if self._truncate:
            self._episodes_ended[env_id] += 1
        else:
            self._episodes_to_build.append((episode, int(self._episode_steps[env_id])))
        self._episode_steps[env_id] = 0
        self._finished_in_round.append(episode)

    def episode_dropped(self, episode: MultiAgentEpisode) -> None:
        """No training data from a faulty episode: its unbuilt rows and steps go."""
        env_id = episode.env_id
        # An episode that ended in this round owns the sub-env's agent steps of the round;
        # one dropped after it started in it and has taken none.
        ended_in_round = any(e.env_id == env_id for e in self._finished_in_round)
        self._forget_steps(episode, agent_steps=not ended_in_round)
        self._finished_in_round.append(episode)

    def undo_round(self, env_id: int) -> None:
        """The runner step that polled or reset the sub-env raised before all its rows were
        stored: its counts go back to where the step found them, and an episode that ended
        in the step loses its rows (some may be missing) and its steps. Episodes that ended
        before keep theirs, to be built as usual; the episode running now is the caller's
        to drop (``episode_dropped``)."""
        self._counts[:, env_id] = self._counts_at_round_start[:, env_id]
        finished = [e for e in self._finished_in_round if e.env_id == env_id]
        for episode in finished:  # its steps are counted as its episode's (one ran then)
            self._forget_steps(episode, agent_steps=True)
        if finished:
            self._episodes_to_build = [
                (e, n) for e, n in self._episodes_to_build if e not in finished
            ]

    def _forget_steps(self, episode: MultiAgentEpisode, *, agent_steps: bool) -> None:
        """Drops the episode's unbuilt rows, and its sub-env's running-episode steps."""
        keys = self._live_keys(episode)
        if keys:
            mask = self._keys.mask(keys)
            for store in self.stores.values():
                store.drop_keys(mask)
            self._keys.release(np.asarray(keys, np.int64))
        env_id = episode.env_id
        self._env_steps[env_id] -= self._episode_steps[env_id]
        self._episode_steps[env_id] = 0
        if agent_steps:
            self._agent_steps[env_id] -= self._episode_agent_steps[env_id]
            self._episode_agent_steps[env_id] = 0

    def forget(self, episode: MultiAgentEpisode) -> None:
        """An episode kept out of training ended: its trajectory keys (it stored no rows) go."""
        keys = self._live_keys(episode)
        if keys:
            self._keys.release(np.asarray(keys, np.int64))

    def move_rows(self, from_policy: str, to_policy: str | None) -> None:
        """A removed policy's stored rows go to the policy its agents now map to.

        With no running agent left (``to_policy`` None), its store stays until
        its rows have been handed out.
        """
        if to_policy is None or from_policy not in self.stores:
            return
        source = self.stores.pop(from_policy)
        target = self.stores.get(to_policy)
        if target is None:
            self.stores[to_policy] = source
            source.policy_id = to_policy
        else:
            target.extend(source)

    def _live_keys(self, episode: MultiAgentEpisode) -> list[int]:
        """The episode's trajectory keys not yet released (and so not reused)."""
        return [slot.key for slot in self._keys.live_slots(episode)]

    # ---- building

    def build_ready(self, postprocess: Postprocess, *, flush: bool = False) -> list[MultiAgentBatch]:
        """Every fragment that is due now. ``flush`` (the end of a run): in
        ``truncate_episodes`` mode every sub-env's transitions stored since its last
        fragment are due too, as fragments shorter than ``rollout_fragment_length``."""
        if self._truncate:
            if flush:
                ready = np.flatnonzero((self._env_steps > 0) | (self._agent_steps > 0))
            else:
                counts = self._agent_steps if self._count_agent_steps else self._env_steps
                ready = np.flatnonzero(counts >= self._length)
            if not len(ready):
                return []
            env_mask = np.zeros(len(self._env_steps), bool)
            env_mask[ready] = True
            env_steps = int(self._env_steps[ready].sum())
            for counter in (
                self._env_steps, self._agent_steps, self._episode_steps, self._episode_agent_steps
            ):
                counter[ready] = 0
            self.fragments_per_env[ready] += 1
            self.built_episodes += int(self._episodes_ended[ready].sum())
            self._episodes_ended[ready] = 0
            return [self._build(env_mask[self._keys.env_id], env_steps, postprocess)]
        # Those built before a build raised (a post-processing hook) come out first.
        batches, self._built_before_error = self._built_before_error, []
        while self._episodes_to_build:
            episode, steps = self._episodes_to_build.pop(0)  # one that raises is not retried
            mask = self._keys.mask(self._live_keys(episode))
            try:
                batches.append(self._build(mask, steps, postprocess))
            except BaseException:
                self._built_before_error = batches
                raise
            self.built_episodes += 1
            self.fragments_per_env[episode.env_id] += 1
        return batches

    def _build(self, key_mask: np.ndarray, env_steps: int, postprocess: Postprocess) -> MultiAgentBatch:
        """Transitions of the masked trajectories, post-processed, as one MultiAgentBatch.
        If post-processing raises, the fragment is lost (its rows left the store), and
        its finished trajectories' keys are freed all the same."""
        self._unroll_id += 1
        built: dict[str, tuple[SampleBatch, Segments]] = {}
        finished = []
        try:
            for policy_id, store in list(self.stores.items()):
                batch, done_keys, segments = store.build(key_mask, self._keys, self._unroll_id)
                finished.append(done_keys)
                if batch is not None:
                    built[policy_id] = (batch, segments)
            policy_batches = postprocess(built)
        finally:
            for done_keys in finished:
                if len(done_keys):
                    self._keys.release(done_keys)
        return MultiAgentBatch(policy_batches, env_steps)
