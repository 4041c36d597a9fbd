"""EnvRunner: polls the vector env, runs connectors and policies, builds training batches.

``step()`` is the sampling loop (docs/DESIGN.md), one method per step: poll,
collect, agent connectors, forward, action connectors, send, store, build
fragments. Data moves as per-policy columns: one agent-connector call, ONE
forward pass and one action-connector call per policy per round, whatever the
number of agents and sub-envs. ``sample()`` steps until its target is reached.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from connectors.data import AgentRows
from connectors.imports import import_object
from marl_runner.batch import MultiAgentBatch, SampleBatch, concat_multi_agent
from marl_runner.callbacks import Callbacks, overridden_hooks
from marl_runner.config import RunnerConfig
from marl_runner.envs import BaseEnv, make_vector_env
from marl_runner.envs.errors import EpisodeFault
from marl_runner.metrics import MetricsCollector, PerfStats, StepTimer
from marl_runner.policy import Policy
from marl_runner.policy.torch_utils import limit_inference_threads
from marl_runner.sampling.env_output import PollResult, SubEnvOutput, poll_method
from marl_runner.sampling.episode import AgentSlot
from marl_runner.sampling.fragments import FragmentBuilder
from marl_runner.sampling.lifecycle import EpisodeLifecycle, SubEnvError
from marl_runner.sampling.obs_misfit import run_agent_pipeline
from marl_runner.sampling.policy_map import PolicyMap
from marl_runner.sampling.policy_outputs import (
    Evaluated,
    policy_input,
    refuse_nan_final_obs,
    refuse_nan_outputs,
    run_action_connectors,
    stored_columns,
)
from marl_runner.sampling.postprocess import postprocess_trajectories
from marl_runner.sampling.round import Round, RoundCollector
from marl_runner.sampling.trajectories import KeyTable, Segments

_ENV_ID = attrgetter("env_id")


class RoundActions(NamedTuple):
    """The action connectors' result: ``env_id -> agent_id -> action`` for every sub-env of
    the round, and per policy the action-side columns stored over all its rows."""

    by_env: dict[int, dict]
    columns: dict[str, dict[str, np.ndarray]]


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
            limit_inference_threads(config.torch_threads)
        if callbacks is None and config.callbacks:
            callbacks = import_object(config.callbacks)()
        self.callbacks = callbacks or Callbacks()
        self._hooks = overridden_hooks(self.callbacks)
        self._env: BaseEnv = make_vector_env(config)
        # poll_blocks where the env's poll_blocks is as specific as its poll (env_output).
        self._poll_env = poll_method(self._env)
        try:
            self.policy_map = PolicyMap(
                {**config.policies, **(policies or {})},
                policy_mapping_fn or config.policy_mapping_fn,
                possible_agents=self._env.possible_agents,
                spaces_of=lambda a: (self._env.get_observation_space(a), self._env.get_action_space(a)),
                runner_config=config,
                mapping_context={"runner": self, "worker": self},
            )
        except BaseException:
            self._env.stop()
            raise
        self._key_table = KeyTable()
        self._fragments = FragmentBuilder(
            config.num_envs,
            config.rollout_fragment_length,
            truncate_episodes=config.batch_mode == "truncate_episodes",
            count_agent_steps=config.count_steps_by == "agent_steps",
            key_table=self._key_table,
            exclude_columns=self._stored_exclusions,
        )
        self._perf = PerfStats(config.ema_coef)
        self._metrics = MetricsCollector()
        self._episodes = EpisodeLifecycle(
            self._env, self.policy_map, self._fragments, self._key_table, self._metrics,
            self._perf.get, self.callbacks, self._hooks,
            {"runner": self, "worker": self, "base_env": self._env, "policies": self.policy_map},
            config,
        )
        self._collector = RoundCollector(
            self._episodes.new_slot,
            lambda pid: self.policy_map.entries[pid].original_observation_space,
            config.fake_obs,
        )
        self._num_env_steps_total = 0
        # Sub-envs polled or reset this step whose actions are not both sent and stored
        # yet: if the step raises, their episodes cannot go on (recovered at the next step).
        self._unfinished: set[int] = set()
        self._to_reset: set[int] = set()
        # What a raising step or sample had already built: handed out next time.
        self._undelivered: list = []
        self._unreturned_batches: list[MultiAgentBatch] = []
        self._deferred_error: BaseException | None = None
        self._stop_requested = False
        self._flush_on_stop = True
        self._stopped = False

    # ------------------------------------------------------------------ policies

    @property
    def env(self) -> BaseEnv:
        """The vector env the runner samples from."""
        return self._env

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
        return self.policy_map.add(policy_id, policy_or_spec, policy_mapping_fn)

    def remove_policy(self, policy_id: str) -> None:
        """Removes a policy; agents of running episodes that used it are re-mapped.

        All of its live agents must now map to ONE policy, which takes over
        their unfinished trajectories; anything else would split what was one
        evaluation group mid-episode, so it raises. If it raises (that, or an
        error from the mapping fn), nothing changed: the policy stays and its
        agents keep playing it.
        """
        removed = self.policy_map.remove(policy_id)
        remapped: list[tuple[AgentSlot, str]] = []
        try:
            for episode in self._episodes.active.values():
                for agent_id, slot in episode.slots.items():
                    if slot.policy_id == policy_id and not slot.done:
                        remapped.append((slot, episode.policy_for(agent_id, refresh=True)))
            targets = {target for _, target in remapped}
            if len(targets) > 1:
                raise ValueError(
                    f"removing policy {policy_id!r}: its running agents now map to several "
                    f"policies {sorted(targets)}; a mapping must not split one evaluation group "
                    "mid-episode"
                )
            for slot, target in remapped:
                self.policy_map.entry_for(target, slot.agent_id)
        except BaseException:
            # The episodes' cached mappings may hold the new ids, but an agent with a
            # slot is never mapped from the cache again: its slot decides.
            self.policy_map.restore(policy_id, removed)
            raise
        for episode in self._episodes.active.values():
            episode.layouts.clear()
        for slot, target in remapped:
            slot.policy_id = target
        self._fragments.move_rows(policy_id, targets.pop() if targets else None)

    def set_policy_mapping_fn(self, fn: Callable[..., str] | str | dict) -> None:
        """New mapping for agents mapped from now on; agents already mapped in a
        running episode keep their policy until that episode ends (``remove_policy``
        is what moves running agents to another policy)."""
        self.policy_map.set_mapping_fn(fn)

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``policy_id -> (policy input obs space, action space)``."""
        return self.policy_map.get_spaces()

    def get_weights(self) -> dict[str, Any]:
        """``policy_id -> weights`` of the built policies."""
        return self.policy_map.get_weights()

    def set_weights(self, weights: dict[str, Any]) -> None:
        """Loads weights per policy id (built policies only); each sets its policy's version."""
        self.policy_map.set_weights(weights)

    def policy_versions(self) -> dict[str, int]:
        """``policy_id -> policy_version`` of the built policies: how many times their
        weights were set; rows record the version that chose their action."""
        return {pid: policy.policy_version for pid, policy in self.policy_map.items()}

    def get_state(self) -> dict[str, Any]:
        """Weights and connector state (e.g. observation filter statistics) per policy."""
        return self.policy_map.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Weights and connector state per policy, as ``get_state`` returns them.

        Connector state is taken over in place: filter statistics are replaced,
        while running episodes keep their RNN states, previous actions and
        stacked frames, and each pipeline keeps its train/eval mode.
        """
        self.policy_map.set_state(state)

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        num_env_steps: int | None = None,
        num_agent_steps: int | None = None,
        num_episodes: int | None = None,
    ) -> MultiAgentBatch:
        """Steps until the target is reached; by default one fragment (or episode) per sub-env.

        If it raises, the fragments it had built are not lost: the next call returns them
        (and counts them towards its target). After `request_stop()` it returns at the end
        of the round (see there)."""
        batches = self._unreturned_batches
        env_steps = sum(b.env_steps() for b in batches)
        agent_steps = sum(b.agent_steps() for b in batches)
        start_episodes = self._fragments.built_episodes
        start_fragments = self._fragments.fragments_per_env.copy()
        default_target = num_env_steps is None and num_agent_steps is None and num_episodes is None
        while True:
            built = False
            for item in self.step():
                if isinstance(item, MultiAgentBatch):
                    built = True
                    batches.append(item)
                    env_steps += item.env_steps()
                    agent_steps += item.agent_steps()
            # (Fragments per sub-env change only when some are built.)
            if default_target and built and (self._fragments.fragments_per_env > start_fragments).all():
                break
            if num_env_steps is not None and env_steps >= num_env_steps:
                break
            if num_agent_steps is not None and agent_steps >= num_agent_steps:
                break
            if num_episodes is not None and self._fragments.built_episodes - start_episodes >= num_episodes:
                break
            if self._stop_requested:
                break
        if self._stop_requested:  # (also when it came in the round that reached the target)
            if self._flush_on_stop:
                batches.extend(self._fragments.build_ready(self._postprocess, flush=True))
            self._stop_requested = False
        samples = concat_multi_agent(batches)
        if "on_sample_end" in self._hooks:
            # Before the batches are let go: if the hook raises, the next call returns them.
            self.callbacks.on_sample_end(runner=self, samples=samples)
        self._unreturned_batches = []
        return samples

    def request_stop(self, flush: bool = True) -> None:
        """A running `sample()` returns at the end of its round, with `flush()`'s rows (with
        ``flush=False``, those are left to the caller's own `flush()`, where a further
        interrupt cannot cut their build short): a Ctrl-C handler may call it (it sets flags)."""
        self._stop_requested = True
        self._flush_on_stop = flush

    def flush(self) -> MultiAgentBatch:
        """Everything sampled and not handed out yet, for the end of a run, so that every
        finished episode gets out: the fragments of a `sample()` that raised, and (in
        `truncate_episodes` mode) each sub-env's transitions since its last fragment, as
        fragments shorter than `rollout_fragment_length`. A fragment's episodes go on in
        the next `sample()`, whose rows continue them (`continues`).

        After a step that raised part-way, the episodes that ran or ended in it are
        dropped (faulty), as the next step would; those its sub-envs finished before
        come out (`FragmentBuilder.undo_round`).
        """
        outputs = self._undelivered
        if self._unfinished:
            self._recover_interrupted_step(outputs)
        # Built before anything is let go: if a hook raises, the next call hands it all out.
        built = self._fragments.build_ready(self._postprocess, flush=True)
        batches = [
            *self._unreturned_batches, *(o for o in outputs if isinstance(o, MultiAgentBatch)), *built
        ]
        self._undelivered, self._unreturned_batches = [], []
        self._stop_requested = False
        return concat_multi_agent(batches)

    def step(self) -> list:
        """One round of the loop; returns built batches and episode metrics.

        Any exception leaves the runner usable: the sub-envs whose step did not
        finish lose their running episode (recorded as faulty) and are reset,
        and what the step had built is returned by the next step.
        """
        if self._stopped:
            raise RuntimeError("this EnvRunner was stopped; build a new one to sample again")
        outputs, self._undelivered = self._undelivered, []
        try:
            if self._unfinished:
                self._recover_interrupted_step(outputs)
            self._fragments.begin_round()
            self._episodes.begin_round()
            timer = StepTimer()
            polled = self._poll()
            timer.lap("poll")
            round_ = self._collect(polled, outputs)
            timer.lap("collect")
            rows = self._run_agent_connectors(round_)
            timer.lap("agent_connectors")
            evaluated = self._forward(rows)
            timer.lap("forward")
            actions = self._run_action_connectors(round_, evaluated, polled.off_policy())
            timer.lap("action_connectors")
            self._send(actions.by_env)
            timer.lap("send")
            self._store(rows, actions.columns)
            self._unfinished.clear()
            timer.lap("store")
            outputs.extend(self._build_fragments())
            timer.lap("build_fragments")
            self._perf.record_step(timer.seconds)
        except BaseException:
            self._undelivered = outputs
            raise
        if self._deferred_error is not None:
            error, self._deferred_error = self._deferred_error, None
            self._undelivered = outputs
            raise error
        return outputs

    # ---- poll

    def _poll(self) -> PollResult:
        polled = PollResult._make(self._poll_env())
        if self._episodes.cuts_overlong:
            self._episodes.cut_overlong(polled)
        self._unfinished.update(polled.obs)
        return polled

    # ---- collect

    def _collect(self, polled: PollResult, outputs: list) -> Round:
        """The round's rows per policy from the polled sub-envs (and the reset obs of those
        reset in it); episodes started, stepped, ended and dropped on the way."""
        round_ = Round()
        episodes = self._episodes
        to_reset, self._to_reset = self._to_reset, set()
        # Unfinished until the step is: if it raises before resetting them, they are not lost.
        self._unfinished.update(to_reset)
        # Left-over sub-envs of a step that did not finish are skipped: their reset replaces them.
        stepped, rest, ended = self._collector.collect_unchanged(
            round_, polled, episodes.active, to_reset
        )
        episodes.advance(stepped)
        for env_id in rest:
            output = polled.of(env_id)
            if isinstance(output.obs, BaseException):
                if not output.all_terminated:
                    raise AssertionError(
                        f"sub-env {env_id} returned an exception but its terminateds['__all__'] "
                        f"is not True: a failed sub-env must end its episode ({output.obs!r})"
                    )
                outputs.append(episodes.drop(env_id, output.obs))
                if not isinstance(output.obs, EpisodeFault):
                    # The sub-env itself failed (not, say, a client gone quiet): restart or raise.
                    self._defer(episodes.recover, env_id, output.obs)
                to_reset.add(env_id)
                continue
            episode = episodes.episode_for(env_id)
            if episode.length:
                stepped.append(episode)
            self._collector.collect(round_, episode, output)
            if output.episode_over:
                ended.append(episode)
        if stepped:
            self._count_env_steps(stepped)
        for episode in ended:
            outputs.append(episodes.end(episode))
            to_reset.add(episode.env_id)
        self._reset_sub_envs(round_, sorted(to_reset), outputs)
        awaiting, gone = episodes.awaiting_reset, episodes.gone
        round_.env_ids = [
            env_id
            for env_id in {**polled.obs, **dict.fromkeys(to_reset)}
            if env_id not in awaiting and env_id not in gone
        ]
        return round_

    def _reset_sub_envs(self, round_: Round, env_ids: list[int], outputs: list) -> None:
        """Resets each sub-env in turn. If one raises (other than SubEnvError, which waits
        for the end of the step), it and those after it are tried again next step: a
        forgotten sub-env is never polled again, and sample() would wait for it forever."""
        for done, env_id in enumerate(env_ids):
            try:
                self._reset_sub_env(round_, env_id, outputs)
            except BaseException:
                self._to_reset.update(env_ids[done:])
                raise

    def _reset_sub_env(self, round_: Round, env_id: int, outputs: list) -> None:
        """Connectors forget the sub-env, which is reset; its reset obs join this round.
        Its new episode is unfinished until the round is sent and stored: a sub-env
        reset in a step that raises is not polled again unless it is reset again."""
        self._unfinished.add(env_id)
        for entry in self.policy_map.entries.values():
            entry.agent_pipeline.reset(env_id)
        reset = self._defer(self._episodes.reset, env_id, outputs)
        if reset is not None:
            episode, reset_obs, reset_infos = reset
            self._collector.collect(round_, episode, SubEnvOutput.of_reset(reset_obs, reset_infos))
        elif env_id not in self._episodes.awaiting_reset:
            self._to_reset.add(env_id)  # its resets kept failing: try again next step

    def _count_env_steps(self, stepped: list) -> None:
        env_ids = np.fromiter(map(_ENV_ID, stepped), np.int64, len(stepped))
        untrained = self._episodes.untrained_env_ids
        if untrained:
            env_ids = env_ids[~np.isin(env_ids, list(untrained))]
        self._fragments.count_env_steps(env_ids)
        self._num_env_steps_total += len(stepped)
        self._metrics.num_env_steps += len(stepped)
        self._episodes.stepped(stepped)

    # ---- agent connectors

    def _run_agent_connectors(self, round_: Round) -> dict[str, AgentRows]:
        """Each policy's rows of the round through its agent pipeline, once."""
        entries, space = self.policy_map.entries, self._env.get_observation_space
        return {
            pid: run_agent_pipeline(entries[pid].agent_pipeline, rows, space)
            for pid, rows in round_.to_agent_rows(self._key_table).items()
        }

    # ---- forward

    def _forward(self, rows_by_policy: dict[str, AgentRows]) -> dict[str, Evaluated]:
        """ONE forward pass per policy over all its rows, if any of them needs an action.

        Done rows go through it too: a few more rows cost the model less than
        selecting every column and spreading every output back, and their
        outputs are neither sent nor part of any transition (a trajectory's last
        row only closes one).
        """
        evaluated = {}
        explore = self.config.explore
        for policy_id, rows in rows_by_policy.items():
            acting, inputs = policy_input(rows)
            if acting is not None:  # some rows are done
                refuse_nan_final_obs(policy_id, rows, acting)
                if not len(acting):
                    continue
            output = self.policy_map[policy_id].compute_actions_from_input_dict(
                inputs, explore=explore, timestep=self._num_env_steps_total
            )
            evaluated[policy_id] = refuse_nan_outputs(policy_id, Evaluated(acting, inputs, output))
        return evaluated

    # ---- action connectors

    def _run_action_connectors(
        self,
        round_: Round,
        evaluated: dict[str, Evaluated],
        off_policy: dict[int, dict],
    ) -> RoundActions:
        """Each policy's action pipeline, once: env actions per sub-env of the round, and
        the action-side columns to store with each policy's rows."""
        by_env: dict[int, dict] = {env_id: {} for env_id in round_.env_ids}
        columns = {}
        entries = self.policy_map.entries
        for policy_id, policy_evaluated in evaluated.items():
            columns[policy_id] = run_action_connectors(
                entries[policy_id], policy_evaluated, off_policy, by_env
            )
        return RoundActions(by_env, columns)

    # ---- send

    def _send(self, actions: dict[int, dict]) -> None:
        """Before the store: subprocess and Ray sub-envs step while the rows are stored
        (a step that raises after it still drops the round's episodes, `_unfinished`)."""
        self._env.send_actions(actions)

    # ---- store

    def _store(self, rows_by_policy: dict[str, AgentRows], action_columns: dict) -> None:
        """The round's rows with their actions and the policy version go to the trajectory
        store (rows of episodes kept out of training do not); agent steps are counted."""
        untrained = self._episodes.untrained_env_ids
        policies = self.policy_map
        for policy_id, rows in rows_by_policy.items():
            chunk = stored_columns(rows)
            chunk.update(action_columns.get(policy_id) or {})
            # The weights that chose the row's action (every row of a round: same policy),
            # one value the store spreads over the rows.
            chunk["policy_version"] = np.int64(policies[policy_id].policy_version)
            chunk["env_t"] = self._episodes.env_t(rows["env_ids"], rows["keys"])
            closing = ~rows["is_first"]
            self._metrics.num_agent_steps += int(np.count_nonzero(closing))
            num_rows = len(rows)
            env_ids = rows["env_ids"]
            if untrained:  # by trajectory: an ended episode's last rows and the next's first
                trained = self._key_table.trained[rows["keys"]]
                chunk = {
                    name: column[trained] if np.ndim(column) else column
                    for name, column in chunk.items()
                }
                num_rows = int(np.count_nonzero(trained))
                closing &= trained
            self._fragments.add_rows(policy_id, chunk, num_rows, env_ids, closing)

    # ---- build fragments

    def _build_fragments(self) -> list[MultiAgentBatch]:
        """Every fragment now due, post-processed."""
        return self._fragments.build_ready(self._postprocess)

    def _postprocess(self, built: dict[str, tuple[SampleBatch, Segments]]) -> dict[str, SampleBatch]:
        entries = self.policy_map.entries
        wanting = frozenset(pid for pid, e in entries.items() if e.wants_postprocess)
        hook = None
        if "on_postprocess_trajectory" in self._hooks:
            def hook(**kwargs: Any) -> None:
                self.callbacks.on_postprocess_trajectory(
                    runner=self, worker=self, policies=self.policy_map, **kwargs
                )
        batches = postprocess_trajectories(built, self.policy_map, wanting, self._key_table, hook)
        excluded = self.config.exclude_columns
        if excluded:
            for batch in batches.values():  # what was kept for post-processing only
                for name in excluded:
                    batch.pop(name, None)
        return batches

    def _stored_exclusions(self, policy_id: str) -> frozenset[str]:
        """The columns ``exclude_columns`` leaves out of the policy's store: new_obs is
        built anyway where a post-processing pass reads it (GAE's bootstrap value)."""
        excluded = frozenset(self.config.exclude_columns)
        entry = self.policy_map.entries.get(policy_id)
        if "new_obs" in excluded and (
            "on_postprocess_trajectory" in self._hooks or (entry is not None and entry.wants_postprocess)
        ):
            excluded -= {"new_obs"}
        return excluded

    # ---- faults

    def _defer(self, action: Callable[..., Any], *args: Any) -> Any:
        """Runs ``action``; a SubEnvError it raises waits for the end of the step, so the
        other sub-envs' data of this round is processed and kept first."""
        try:
            return action(*args)
        except SubEnvError as error:
            if self._deferred_error is None:
                self._deferred_error = error
            return None

    def _recover_interrupted_step(self, outputs: list) -> None:
        """The last step raised before its actions were sent and its rows stored: the
        polled (or reset) sub-envs' episodes cannot go on. They are dropped (no training
        data) and reset; the results of a step they were sent are never handed out
        (`_collect` skips them; `try_reset` drops one still pending). Their episodes that
        had ended in earlier steps keep their rows (`FragmentBuilder.undo_round`)."""
        interrupted = sorted(self._unfinished)
        self._unfinished.clear()
        # Each is reset whatever a callback below raises: one left out would never be polled.
        self._to_reset.update(interrupted)
        for env_id in interrupted:
            self._fragments.undo_round(env_id)
        self._episodes.drop_interrupted(interrupted, outputs)

    # ------------------------------------------------------------------ metrics, life cycle

    def get_metrics(self) -> dict[str, Any]:
        """Metrics since the last call (see docs for the keys)."""
        return self._metrics.summary(self._perf.get(), self.policy_map.pop_connector_timings())

    def stop(self) -> None:
        """Ends the vector env (workers, actors); the runner cannot sample afterwards."""
        self._stopped = True
        self._env.stop()

    def __enter__(self) -> EnvRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
