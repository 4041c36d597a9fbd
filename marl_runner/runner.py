"""EnvRunner: polls the vector env, runs connectors and policies, builds training batches.

One ``step()`` is the six steps of SPEC.md, each a method named after it:
poll, process observations, evaluate policies, process policy outputs, send
actions, and record perf stats. Data moves as per-policy columns: one
connector call and ONE forward pass per policy per round, whatever the
number of agents and sub-envs.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.data import ActionRows, AgentRows
from marl_runner.batch import MultiAgentBatch, SampleBatch, concat_samples
from marl_runner.callbacks import Callbacks, overridden_hooks
from marl_runner.collectors import postprocess_trajectories
from marl_runner.config import RunnerConfig
from marl_runner.envs import BaseEnv, make_vector_env
from marl_runner.episode import AgentSlot, EpisodeLayout, MultiAgentEpisode
from marl_runner.fake_obs import fake_final_obs
from marl_runner.imports import import_object
from marl_runner.mapping import make_policy_mapping_fn
from marl_runner.metrics import MetricsCollector, PerfStats, RolloutMetrics
from marl_runner.policy import Policy
from marl_runner.policy_outputs import (
    apply_off_policy_actions,
    distribute_actions,
    scatter,
    stored_columns,
)
from marl_runner.policy_setup import PolicyEntry, build_entry, infer_policy_spaces
from marl_runner.rounds import RoundRows, merge_rows
from marl_runner.trajectories import KeyTable

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_RESET_FAILURES = 5
_EMPTY_INFO: dict = {}


class NoObservationError(RuntimeError):
    """An episode ended without the env ever observing any agent."""


class EnvRunner:
    """Samples multi-agent episodes from a vector env into per-policy batches."""

    def __init__(
        self,
        config: RunnerConfig | dict,
        *,
        policies: dict[str, Policy] | None = None,
        policy_mapping_fn: Callable[..., str] | None = None,
        callbacks: Callbacks | None = None,
    ) -> None:
        if isinstance(config, dict):
            config = RunnerConfig.from_dict(config)
        config.check_imports()
        self.config = config
        if config.torch_threads is not None:
            import torch

            torch.set_num_threads(config.torch_threads)
        self._ready_policies = dict(policies or {})
        self._policy_specs: dict[str, Any] = {**config.policies, **self._ready_policies}
        # A live view: policies added later are valid mapping results too.
        self._mapping_fn = make_policy_mapping_fn(
            policy_mapping_fn or config.policy_mapping_fn, self._policy_specs.keys()
        )
        if callbacks is None and config.callbacks:
            callbacks = import_object(config.callbacks)()
        self.callbacks = callbacks or Callbacks()
        self._hooks = overridden_hooks(self.callbacks)
        self._rng = random.Random(config.seed)
        self._key_table = KeyTable()
        self._env: BaseEnv = make_vector_env(config)
        self._entries: dict[str, PolicyEntry] = {}
        # Stores of removed policies whose rows still wait to be handed out.
        self._orphan_stores: list = []
        self._build_policies()

        self._episodes: dict[int, MultiAgentEpisode] = {}
        self._steps_since_build = np.zeros(config.num_envs, np.int64)
        self._agent_steps_since_build = np.zeros(config.num_envs, np.int64)
        self._episodes_ended_unbuilt = np.zeros(config.num_envs, np.int64)
        self._episodes_to_build: list[MultiAgentEpisode] = []
        self._built_episodes = 0
        self._fragments_per_env = np.zeros(config.num_envs, np.int64)
        self._awaiting_reset: set[int] = set()
        self._reset_failures: dict[int, int] = {}
        self._unroll_id = 0
        self._num_env_steps_total = 0
        self._truncate = config.batch_mode == "truncate_episodes"
        self._count_agent_steps = config.count_steps_by == "agent_steps"
        self._keep_last_obs = config.fake_obs == "last"
        self._perf = PerfStats(config.ema_coef)
        self._metrics = MetricsCollector()

    # ------------------------------------------------------------------ policies

    @property
    def policy_map(self) -> dict[str, Policy]:
        return {pid: entry.policy for pid, entry in self._entries.items()}

    @property
    def env(self) -> BaseEnv:
        return self._env

    def _build_policies(self) -> None:
        probe = self._new_episode(env_id=-1, episode_id=-1)
        spaces = infer_policy_spaces(
            self._env.possible_agents,
            probe.policy_for,
            self._env.get_observation_space,
            self._env.get_action_space,
        )
        for policy_id, spec in self._policy_specs.items():
            if policy_id in spaces:
                obs_space, act_space, _ = spaces[policy_id]
                self._add_entry(policy_id, spec, obs_space, act_space)
            elif isinstance(spec, Policy) or (spec.get("observation_space") and spec.get("action_space")):
                self._add_entry(policy_id, spec, None, None)
            # Otherwise built when its first agent appears (agents spawned later).

    def _add_entry(self, policy_id: str, spec: Any, obs_space: Any, act_space: Any) -> PolicyEntry:
        if isinstance(spec, Policy):
            obs_space = obs_space or spec.observation_space
            act_space = act_space or spec.action_space
        entry = build_entry(
            policy_id, spec, obs_space, act_space, seed=self.config.seed, runner_config=self.config
        )
        self._entries[policy_id] = entry
        return entry

    def _entry_for(self, policy_id: str, agent_id: Any) -> PolicyEntry:
        entry = self._entries.get(policy_id)
        if entry is None:
            entry = self._add_entry(
                policy_id,
                self._policy_specs[policy_id],
                self._env.get_observation_space(agent_id),
                self._env.get_action_space(agent_id),
            )
        return entry

    def _check_policy_id(self, agent_id: Any, policy_id: Any) -> str:
        if policy_id not in self._policy_specs:
            raise ValueError(
                f"policy mapping fn returned {policy_id!r} for agent {agent_id!r}, which is not "
                f"a known policy id; expected one of {sorted(self._policy_specs)}"
            )
        return policy_id

    def add_policy(
        self,
        policy_id: str,
        policy_or_spec: Policy | dict,
        policy_mapping_fn: Callable[..., str] | str | dict | None = None,
    ) -> Policy | None:
        """Adds a policy between samples; its spaces come from the agents mapped to it.

        With no agent mapped to it yet (and no spaces in the spec), it is built
        when its first agent appears; then this returns None.
        """
        if policy_id in self._policy_specs:
            raise ValueError(f"policy id {policy_id!r} already exists")
        self._policy_specs[policy_id] = policy_or_spec
        if policy_mapping_fn is not None:
            self.set_policy_mapping_fn(policy_mapping_fn)
        probe = self._new_episode(env_id=-1, episode_id=-1)
        spaces = infer_policy_spaces(
            self._env.possible_agents, probe.policy_for,
            self._env.get_observation_space, self._env.get_action_space,
        )
        if policy_id in spaces:
            obs_space, act_space, _ = spaces[policy_id]
            return self._add_entry(policy_id, policy_or_spec, obs_space, act_space).policy
        if isinstance(policy_or_spec, Policy):
            return self._add_entry(policy_id, policy_or_spec, None, None).policy
        return None

    def remove_policy(self, policy_id: str) -> None:
        """Removes a policy; agents of running episodes that used it are re-mapped.

        All of its live agents must now map to ONE policy, which takes over
        their unfinished trajectories; anything else would split what was one
        evaluation group mid-episode, so it raises.
        """
        if policy_id not in self._policy_specs:
            raise KeyError(f"no policy {policy_id!r}; policies: {sorted(self._policy_specs)}")
        del self._policy_specs[policy_id]
        entry = self._entries.pop(policy_id, None)
        targets: set[str] = set()
        for episode in self._episodes.values():
            episode.layout = None
            for agent_id, slot in episode.slots.items():
                if slot.policy_id == policy_id and not slot.done:
                    slot.policy_id = episode.policy_for(agent_id, refresh=True)
                    targets.add(slot.policy_id)
        if len(targets) > 1:
            raise ValueError(
                f"removing policy {policy_id!r}: its running agents now map to several policies "
                f"{sorted(targets)}; a mapping must not split one evaluation group mid-episode"
            )
        if entry is not None and entry.store.chunks:
            if targets:
                target = targets.pop()
                self._entry_for(target, None).store.extend(entry.store)
            else:
                self._orphan_stores.append(entry.store)

    def set_policy_mapping_fn(self, fn: Callable[..., str] | str | dict) -> None:
        """New mapping for agents mapped from now on; agents already mapped in a
        running episode keep their policy unless re-mapped with ``refresh=True``."""
        self._mapping_fn = make_policy_mapping_fn(fn, self._policy_specs.keys())

    def _map_agent(self, agent_id: Any, episode: MultiAgentEpisode, **kwargs: Any) -> str:
        return self._mapping_fn(agent_id, episode, **kwargs)

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``policy_id -> (policy input obs space, action space)``."""
        return {
            pid: (e.policy.observation_space, e.policy.action_space)
            for pid, e in self._entries.items()
        }

    def get_weights(self) -> dict[str, Any]:
        return {pid: e.policy.get_weights() for pid, e in self._entries.items()}

    def set_weights(self, weights: dict[str, Any]) -> None:
        for pid, w in weights.items():
            self._entries[pid].policy.set_weights(w)

    def get_state(self) -> dict[str, Any]:
        """Weights and connector state (e.g. observation filter statistics) per policy."""
        return {
            pid: {
                "weights": e.policy.get_weights(),
                "agent_connectors": e.agent_pipeline.to_state(),
                "action_connectors": e.action_pipeline.to_state(),
            }
            for pid, e in self._entries.items()
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Weights and connector state per policy, as ``get_state`` returns them.

        Connector state is taken over in place: filter statistics are replaced,
        while running episodes keep their RNN states, previous actions and
        stacked frames, and each pipeline keeps its train/eval mode.
        """
        unknown = sorted(set(state) - set(self._entries))
        if unknown:
            raise KeyError(f"set_state: no built policies {unknown}; policies: {sorted(self._entries)}")
        for pid, policy_state in state.items():
            entry = self._entries[pid]
            entry.policy.set_weights(policy_state["weights"])
            entry.agent_pipeline.set_state(policy_state["agent_connectors"])
            entry.action_pipeline.set_state(policy_state["action_connectors"])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Config, weights and connector state in one file, written atomically."""
        from marl_runner.checkpoint import save_checkpoint

        return save_checkpoint(self, path)

    @classmethod
    def restore(
        cls, path: str | os.PathLike[str], *, overrides: list[str] | None = None, **runner_kwargs: Any
    ) -> EnvRunner:
        """A runner rebuilt from ``save()``'s file; callables and ready-made policies go in ``runner_kwargs``."""
        from marl_runner.checkpoint import restore_checkpoint

        return restore_checkpoint(path, overrides=overrides, runner_cls=cls, **runner_kwargs)

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        num_env_steps: int | None = None,
        num_agent_steps: int | None = None,
        num_episodes: int | None = None,
    ) -> MultiAgentBatch:
        """Steps until the target is reached; by default one fragment (or episode) per sub-env."""
        batches: list[MultiAgentBatch] = []
        env_steps = agent_steps = 0
        start_episodes = self._built_episodes
        start_fragments = self._fragments_per_env.copy()
        default_target = num_env_steps is None and num_agent_steps is None and num_episodes is None
        while True:
            for item in self.step():
                if isinstance(item, MultiAgentBatch):
                    batches.append(item)
                    env_steps += item.env_steps()
                    agent_steps += item.agent_steps()
            if default_target and (self._fragments_per_env > start_fragments).all():
                break
            if num_env_steps is not None and env_steps >= num_env_steps:
                break
            if num_agent_steps is not None and agent_steps >= num_agent_steps:
                break
            if num_episodes is not None and self._built_episodes - start_episodes >= num_episodes:
                break
        samples = concat_samples(batches)
        if "on_sample_end" in self._hooks:
            self.callbacks.on_sample_end(runner=self, samples=samples)
        return samples

    def step(self) -> list:
        """One poll / evaluate / send round; returns built batches and episode metrics."""
        outputs: list = []
        start = perf_counter()
        polled = self._poll()
        after_poll = perf_counter()
        self._perf.add("env_wait", after_poll - start)

        rows_by_policy = self._process_observations(polled, outputs)
        after_obs = perf_counter()
        self._perf.add("raw_obs_processing", after_obs - after_poll)

        policy_outputs = self._evaluate_policies(rows_by_policy)
        after_eval = perf_counter()
        self._perf.add("inference", after_eval - after_obs)

        actions = self._process_policy_outputs(rows_by_policy, policy_outputs, polled)
        outputs.extend(self._build_ready_batches())
        after_actions = perf_counter()
        self._perf.add("action_processing", after_actions - after_eval)

        self._send_actions(actions)
        self._perf.add("env_wait", perf_counter() - after_actions)
        self._perf.end_step()
        return outputs

    # ---- step 1

    def _poll(self) -> tuple:
        return self._env.poll()

    # ---- step 2

    def _process_observations(self, polled: tuple, outputs: list) -> dict[str, AgentRows]:
        """Turns raw env data into per-policy rows that have been through the agent connectors."""
        obs, rewards, terminateds, truncateds, infos, _ = polled
        ended: list[MultiAgentEpisode] = []
        faulty: list[tuple[int, BaseException]] = []
        stepped: list[MultiAgentEpisode] = []
        for env_id, env_obs in obs.items():
            env_terminateds = terminateds.get(env_id) or {}
            env_truncateds = truncateds.get(env_id) or {}
            if isinstance(env_obs, BaseException):
                if not env_terminateds.get("__all__"):
                    raise AssertionError(
                        f"sub-env {env_id} returned an exception but its terminateds['__all__'] "
                        f"is not True: a failed sub-env must end its episode ({env_obs!r})"
                    )
                faulty.append((env_id, env_obs))
                continue
            episode = self._episodes.get(env_id)
            if episode is None:
                episode = self._create_episode(env_id)
            if not episode.started:
                self._awaiting_reset.discard(env_id)
                self._mark_started(episode)
            else:
                episode.length += 1
                episode.unbuilt_steps += 1
                stepped.append(episode)
            self._collect_env(
                episode, env_obs, rewards.get(env_id) or {}, env_terminateds,
                env_truncateds, infos.get(env_id) or {},
            )
            if env_terminateds.get("__all__") or env_truncateds.get("__all__"):
                ended.append(episode)

        rows_a = self._connect()
        if stepped:
            self._count_steps(stepped)
        for episode in ended:
            outputs.append(self._end_episode(episode))
        for env_id, error in faulty:
            outputs.append(self._drop_faulty_episode(env_id, error))

        to_reset = [e.env_id for e in ended] + [env_id for env_id, _ in faulty]
        if not to_reset:
            return rows_a
        for env_id in to_reset:
            for entry in self._entries.values():
                entry.agent_pipeline.reset(env_id)
            self._reset_sub_env(env_id, outputs)
        rows_b = self._connect()
        return merge_rows(rows_a, rows_b)

    def _collect_env(
        self,
        episode: MultiAgentEpisode,
        env_obs: dict,
        env_rewards: dict,
        env_terminateds: dict,
        env_truncateds: dict,
        env_infos: dict,
    ) -> None:
        """Adds one sub-env's data to the round, whole policy groups at once when nothing changed."""
        if self._keep_last_obs:
            episode.last_raw_obs.update(env_obs)
        layout = episode.layout
        if (
            layout is not None
            and layout.agent_set == env_obs.keys()
            and env_rewards.keys() <= layout.agent_set
            and True not in env_terminateds.values()
            and True not in env_truncateds.values()
        ):
            zeros, empty = repeat(0.0), repeat(_EMPTY_INFO)
            for rows, agent_ids, keys in layout.groups:
                rows.obs.extend(map(env_obs.__getitem__, agent_ids))
                rows.rewards.extend(map(env_rewards.get, agent_ids, zeros))
                rows.infos.extend(map(env_infos.get, agent_ids, empty))
                rows.keys.extend(keys)
            return
        self._collect_env_per_agent(
            episode, env_obs, env_rewards, env_terminateds, env_truncateds, env_infos
        )

    def _collect_env_per_agent(
        self,
        episode: MultiAgentEpisode,
        env_obs: dict,
        env_rewards: dict,
        env_terminateds: dict,
        env_truncateds: dict,
        env_infos: dict,
    ) -> None:
        """The general path: spawning and dying agents, stray rewards, episode ends."""
        all_terminated = bool(env_terminateds.get("__all__", False))
        all_truncated = bool(env_truncateds.get("__all__", False))
        slots = episode.slots
        for agent_id, reward in env_rewards.items():
            if agent_id in env_obs:
                continue
            slot = slots.get(agent_id)
            if slot is None:
                before = episode.rewards_before_first_obs
                before[agent_id] = before.get(agent_id, 0.0) + reward
            elif not slot.done:
                slot.pending_reward += reward
            else:
                self._add_late_reward(episode, slot, reward)

        groups: dict[str, tuple[RoundRows, list, list]] = {}
        for agent_id, agent_obs in env_obs.items():
            terminated = all_terminated or bool(env_terminateds.get(agent_id, False))
            truncated = all_truncated or bool(env_truncateds.get(agent_id, False))
            reward = env_rewards.get(agent_id, 0.0)
            slot = slots.get(agent_id)
            if slot is None:
                if terminated or truncated:
                    # Seen for the first time and already done: no transition to close.
                    unassigned = episode.unassigned_rewards
                    carried = episode.rewards_before_first_obs.pop(agent_id, 0.0)
                    unassigned[agent_id] = unassigned.get(agent_id, 0.0) + carried + reward
                    continue
                slot = self._new_slot(episode, agent_id)
                # Rewards before the first obs belong to the agent's first transition.
                slot.pending_reward = episode.rewards_before_first_obs.pop(agent_id, 0.0) + reward
                row_reward, is_first = 0.0, True
            elif slot.done:
                self._add_late_reward(episode, slot, reward)
                continue
            else:
                row_reward, is_first = slot.pending_reward + reward, False
                slot.pending_reward = 0.0
            rows = self._entries[slot.policy_id].round_rows
            rows.add(
                agent_obs, row_reward, env_infos.get(agent_id), slot.key,
                terminated, truncated, is_first,
            )
            if terminated or truncated:
                slot.done = True
            else:
                group = groups.get(slot.policy_id)
                if group is None:
                    group = groups[slot.policy_id] = (rows, [], [])
                group[1].append(agent_id)
                group[2].append(slot.key)

        episode_over = all_terminated or all_truncated
        for agent_id, slot in slots.items():
            if slot.done or agent_id in env_obs:
                continue
            own_terminated = bool(env_terminateds.get(agent_id, False))
            own_truncated = bool(env_truncateds.get(agent_id, False))
            if episode_over or own_terminated or own_truncated:
                self._add_fake_final_obs(
                    episode, slot,
                    all_terminated or own_terminated, all_truncated or own_truncated,
                )

        if episode_over:
            episode.layout = None
        else:
            episode.layout = EpisodeLayout(
                frozenset(a for _, ids, _ in groups.values() for a in ids),
                [(rows, tuple(ids), tuple(keys)) for rows, ids, keys in groups.values()],
            )

    def _add_fake_final_obs(
        self, episode: MultiAgentEpisode, slot: AgentSlot,
        terminated: bool, truncated: bool,
    ) -> None:
        """Closes the last transition of an agent that got no final obs from the env."""
        entry = self._entries[slot.policy_id]
        space = entry.original_observation_space
        fake = fake_final_obs(space, self.config.fake_obs, episode.last_raw_obs.get(slot.agent_id))
        entry.round_rows.add(
            fake, slot.pending_reward, {}, slot.key, terminated, truncated, False
        )
        slot.pending_reward = 0.0
        slot.done = True

    def _add_late_reward(self, episode: MultiAgentEpisode, slot: AgentSlot, reward: float) -> None:
        """A reward after the agent was done: onto its final transition if not handed out yet."""
        if reward == 0:
            return
        if slot.reward_total is None:
            self._key_table.late_reward[slot.key] += reward
        else:
            slot.reward_total += reward
            episode.num_late_rewards += 1
            self._metrics.num_late_rewards += 1

    def _new_slot(self, episode: MultiAgentEpisode, agent_id: Any) -> AgentSlot:
        policy_id = episode.policy_for(agent_id)
        self._entry_for(policy_id, agent_id)
        slot = AgentSlot(agent_id, policy_id, len(episode.slots), -1)
        slot.key = self._key_table.allocate(episode.env_id, episode, slot.index, agent_id, slot)
        episode.slots[agent_id] = slot
        return slot

    def _connect(self) -> dict[str, AgentRows]:
        """Columns per policy, reward sums for metrics, then the agent connectors."""
        connected = {}
        reward_sum = self._key_table.reward_sum
        for policy_id, entry in self._entries.items():
            round_rows = entry.round_rows
            if not round_rows.keys:
                continue
            rows, raw_rewards = round_rows.to_agent_rows(self._key_table)
            reward_sum[rows["keys"]] += raw_rewards
            connected[policy_id] = entry.agent_pipeline(rows)
        return connected

    def _count_steps(self, stepped: list[MultiAgentEpisode]) -> None:
        env_ids = [e.env_id for e in stepped]
        self._steps_since_build[env_ids] += 1
        self._num_env_steps_total += len(env_ids)
        self._metrics.num_env_steps += len(env_ids)
        if "on_episode_step" in self._hooks:
            for episode in stepped:
                self.callbacks.on_episode_step(**self._hook_kwargs(episode))

    # ---- episode life cycle

    def _new_episode(self, env_id: int, episode_id: int | None = None) -> MultiAgentEpisode:
        if episode_id is None:
            episode_id = self._rng.getrandbits(63)
        return MultiAgentEpisode(
            episode_id, env_id, self._map_agent, self._key_table, self._check_policy_id, runner=self
        )

    def _create_episode(self, env_id: int) -> MultiAgentEpisode:
        episode = self._new_episode(env_id)
        self._episodes[env_id] = episode
        if "on_episode_created" in self._hooks:
            self.callbacks.on_episode_created(**self._hook_kwargs(episode))
        return episode

    def _mark_started(self, episode: MultiAgentEpisode) -> None:
        episode.started = True
        if "on_episode_start" in self._hooks:
            self.callbacks.on_episode_start(**self._hook_kwargs(episode))

    def _end_episode(self, episode: MultiAgentEpisode) -> RolloutMetrics:
        if not episode.slots:
            raise NoObservationError(
                f"sub-env {episode.env_id}: the episode ended after {episode.length} steps but "
                f"the env never returned an observation for any agent"
            )
        del self._episodes[episode.env_id]
        agent_rewards = episode.agent_rewards
        record = RolloutMetrics(
            episode_length=episode.length,
            episode_reward=float(sum(agent_rewards.values())),
            agent_rewards=agent_rewards,
            custom_metrics=dict(episode.custom_metrics),
            perf_stats=self._perf.get(),
            hist_data=dict(episode.hist_data),
            media=dict(episode.media),
            connector_metrics={},
            episode_faulty=False,
        )
        self._metrics.add_episode(record)
        if "on_episode_end" in self._hooks:
            self.callbacks.on_episode_end(**self._hook_kwargs(episode))
        if self._truncate:
            self._episodes_ended_unbuilt[episode.env_id] += 1
        else:
            self._episodes_to_build.append(episode)
        return record

    def _drop_faulty_episode(self, env_id: int, error: BaseException) -> RolloutMetrics:
        """No training data from a failed episode: its rows are discarded, the env reset."""
        logger.warning("sub-env %d failed; dropping its episode: %r", env_id, error)
        episode = self._episodes.pop(env_id, None) or self._new_episode(env_id)
        episode.faulty = True
        keys = [slot.key for slot in episode.slots.values() if slot.reward_total is None]
        if keys:
            mask = self._key_table.mask(keys)
            for entry in self._entries.values():
                entry.store.drop_keys(mask)
            self._key_table.release(np.asarray(keys, np.int64))
        self._steps_since_build[env_id] -= episode.unbuilt_steps
        record = RolloutMetrics(
            episode.length, 0.0, {}, dict(episode.custom_metrics), self._perf.get(),
            dict(episode.hist_data), dict(episode.media), {}, True,
        )
        self._metrics.add_episode(record)
        if "on_episode_end" in self._hooks:
            self.callbacks.on_episode_end(**self._hook_kwargs(episode), exception=error)
        if self.config.restart_failed_sub_environments:
            self._env.try_restart(env_id)
        return record

    def _reset_sub_env(self, env_id: int, outputs: list) -> None:
        """Resets (retrying on failure) and collects the reset obs, unless they arrive later."""
        while True:
            episode = self._create_episode(env_id)
            result = self._env.try_reset(env_id)
            if result is None:
                self._awaiting_reset.add(env_id)
                return
            if not isinstance(result, BaseException) and not isinstance(result[0], BaseException):
                self._reset_failures.pop(env_id, None)
                reset_obs, reset_infos = result
                self._mark_started(episode)
                self._collect_env(episode, reset_obs, {}, {}, {}, reset_infos or {})
                return
            error = result if isinstance(result, BaseException) else result[0]
            failures = self._reset_failures.get(env_id, 0) + 1
            self._reset_failures[env_id] = failures
            outputs.append(self._drop_faulty_episode(env_id, error))
            if failures >= MAX_CONSECUTIVE_RESET_FAILURES:
                raise RuntimeError(
                    f"sub-env {env_id} failed to reset {failures} times in a row; last error: {error!r}"
                ) from error

    def _hook_kwargs(self, episode: MultiAgentEpisode) -> dict[str, Any]:
        return {
            "runner": self, "worker": self, "base_env": self._env, "policies": self.policy_map,
            "episode": episode, "env_index": episode.env_id,
        }

    # ---- step 3

    def _evaluate_policies(self, rows_by_policy: dict[str, AgentRows]) -> dict[str, tuple]:
        """ONE forward pass per policy over all its rows that need an action."""
        outputs = {}
        explore = self.config.explore
        for policy_id, rows in rows_by_policy.items():
            needs_action = ~(rows["terminateds"] | rows["truncateds"])
            if needs_action.all():
                input_rows = rows
            elif needs_action.any():
                input_rows = rows.select(needs_action)
            else:
                continue
            policy = self._entries[policy_id].policy
            outputs[policy_id] = (
                needs_action,
                input_rows,
                policy.compute_actions_from_input_dict(
                    input_rows, explore=explore, timestep=self._num_env_steps_total
                ),
            )
        return outputs

    # ---- step 4

    def _process_policy_outputs(
        self, rows_by_policy: dict[str, AgentRows], policy_outputs: dict[str, tuple], polled: tuple
    ) -> dict[int, dict]:
        """Action connectors, env-bound actions per sub-env, and the round's rows stored."""
        actions_by_env: dict[int, dict] = {
            env_id: {} for env_id in polled[0] if env_id not in self._awaiting_reset
        }
        off_policy = {env_id: logged for env_id, logged in polled[5].items() if logged}
        for policy_id, rows in rows_by_policy.items():
            entry = self._entries[policy_id]
            chunk = stored_columns(rows)
            evaluated = policy_outputs.get(policy_id)
            if evaluated is not None:
                needs_action, input_rows, (actions, state_outs, extra) = evaluated
                action_rows = ActionRows(
                    actions=actions, state_outs=state_outs, extra=extra,
                    keys=input_rows["keys"], env_ids=input_rows["env_ids"],
                    agent_ids=input_rows["agent_ids"], input_rows=input_rows,
                )
                env_actions = entry.action_pipeline(action_rows).actions
                distribute_actions(actions_by_env, input_rows, env_actions)
                action_columns = {"actions": actions, **extra}
                for i, state in enumerate(state_outs):
                    action_columns[f"state_out_{i}"] = state
                if off_policy:
                    apply_off_policy_actions(action_columns, input_rows, off_policy)
                    action_rows = action_rows.replace(actions=action_columns["actions"])
                # Stateful connectors (previous action, RNN state) see what is stored.
                entry.agent_pipeline.on_policy_output(action_rows)
                chunk.update(scatter(action_columns, needs_action, len(rows)))
            entry.store.add(chunk)
            self._metrics.num_agent_steps += len(rows) - int(rows["is_first"].sum())
            if self._count_agent_steps:
                closing = ~rows["is_first"]
                self._agent_steps_since_build += np.bincount(
                    rows["env_ids"][closing], minlength=self.config.num_envs
                )
        return actions_by_env

    # ---- step 5

    def _send_actions(self, actions: dict[int, dict]) -> None:
        self._env.send_actions(actions)

    # ---- batch building

    def _build_ready_batches(self) -> list[MultiAgentBatch]:
        batches = []
        if self._truncate:
            counts = self._agent_steps_since_build if self._count_agent_steps else self._steps_since_build
            ready = np.flatnonzero(counts >= self.config.rollout_fragment_length)
            if len(ready):
                env_mask = np.zeros(self.config.num_envs, bool)
                env_mask[ready] = True
                key_mask = env_mask[self._key_table.env_id]
                env_steps = int(self._steps_since_build[ready].sum())
                self._steps_since_build[ready] = 0
                self._fragments_per_env[ready] += 1
                self._agent_steps_since_build[ready] = 0
                self._built_episodes += int(self._episodes_ended_unbuilt[ready].sum())
                self._episodes_ended_unbuilt[ready] = 0
                for episode in self._episodes.values():
                    if env_mask[episode.env_id]:
                        episode.unbuilt_steps = 0
                batches.append(self._build(key_mask, env_steps))
        elif self._episodes_to_build:
            for episode in self._episodes_to_build:
                keys = [s.key for s in episode.slots.values() if s.reward_total is None]
                batches.append(self._build(self._key_table.mask(keys), episode.unbuilt_steps))
                self._built_episodes += 1
                self._fragments_per_env[episode.env_id] += 1
            self._episodes_to_build = []
        return batches

    def _build(self, key_mask: np.ndarray, env_steps: int) -> MultiAgentBatch:
        """Transitions of the masked trajectories, post-processed, as one MultiAgentBatch."""
        self._unroll_id += 1
        built: dict[str, tuple[SampleBatch, np.ndarray]] = {}
        finished = []
        stores = [(pid, e.store) for pid, e in self._entries.items()]
        stores += [(store.policy_id, store) for store in self._orphan_stores]
        for policy_id, store in stores:
            batch, done_keys, segments = store.build(key_mask, self._key_table, self._unroll_id)
            finished.append(done_keys)
            if batch is not None:
                built[policy_id] = (batch, segments)
        self._orphan_stores = [s for s in self._orphan_stores if s.chunks]
        policy_batches = postprocess_trajectories(
            built, self, self._key_table, "on_postprocess_trajectory" in self._hooks
        )
        for done_keys in finished:
            if len(done_keys):
                self._key_table.release(done_keys)
        return MultiAgentBatch(policy_batches, env_steps)

    # ------------------------------------------------------------------ metrics, life cycle

    def get_metrics(self) -> dict[str, Any]:
        """Metrics since the last call (see API.md for the keys)."""
        connector_metrics = {
            pid: {
                "agent": e.agent_pipeline.pop_timings(),
                "action": e.action_pipeline.pop_timings(),
            }
            for pid, e in self._entries.items()
        }
        return self._metrics.summary(self._perf.get(), connector_metrics)

    def stop(self) -> None:
        self._env.stop()

    def __enter__(self) -> EnvRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
