"""Per-trajectory post-processing of built batches (e.g. GAE), for policies and callbacks that ask."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from marl_runner.batch import SampleBatch, concat_samples
from marl_runner.policy import Policy
from marl_runner.sampling.trajectories import KeyTable, Segments

TrajectoryHook = Callable[..., None]


def postprocess_trajectories(
    built: dict[str, tuple[SampleBatch, Segments]],
    policies: Mapping[str, Policy],
    wanting_policies: frozenset[str],
    key_table: KeyTable,
    on_trajectory: TrajectoryHook | None,
) -> dict[str, SampleBatch]:
    """Splits each policy batch into agent trajectories only when someone looks at them.

    ``built`` maps policy id to (batch, its ``Segments``). A policy in
    ``wanting_policies`` gets each trajectory through its
    ``postprocess_trajectory``, with the other agents' trajectories of the
    same episode as sampled; ``on_trajectory`` (the ``on_postprocess_trajectory``
    callback, when overridden) may edit the result in place. Their batches
    come out in key order, one trajectory after another.
    """
    result = {}
    by_episode = None
    in_key_order: dict[str, SampleBatch] = {}
    for policy_id, (batch, segments) in built.items():
        wants_policy = policy_id in wanting_policies
        if not (on_trajectory or wants_policy):
            result[policy_id] = batch
            continue
        if by_episode is None:
            in_key_order = _in_key_order(built)
            # The callback may edit its trajectory in place: the other agents' trajectories
            # it (and a later agent's post-processing) is shown come from a copy of the
            # arrays (one more of each batch, only for the callback). Without it, a policy's
            # post-processing gets views and must not edit its batch in place (GAE adds).
            as_sampled = in_key_order if on_trajectory is None else _in_key_order(built)
            by_episode = _trajectories_by_episode(built, as_sampled, key_table)
        batch = in_key_order[policy_id]
        pieces = []
        for key, start, stop in segments.table.tolist():
            trajectory = batch.rows_slice(start, stop)
            episode = key_table.episode[key]
            agent_id = key_table.agent_id[key]
            others = {a: v for a, v in by_episode.get(id(episode), {}).items() if a != agent_id}
            if wants_policy:
                trajectory = policies[policy_id].postprocess_trajectory(trajectory, others, episode)
            if on_trajectory is not None:
                on_trajectory(
                    episode=episode, agent_id=agent_id, policy_id=policy_id,
                    postprocessed_batch=trajectory, original_batches=others,
                )
            pieces.append(trajectory)
        result[policy_id] = concat_samples(pieces)
    return result


def _in_key_order(built: dict[str, tuple[SampleBatch, Segments]]) -> dict[str, SampleBatch]:
    """Each policy batch copied with each trajectory's rows together (``Segments.order``)."""
    return {pid: batch.select(segments.order) for pid, (batch, segments) in built.items()}


def _trajectories_by_episode(
    built: dict[str, tuple[SampleBatch, Segments]],
    in_key_order: dict[str, SampleBatch],
    key_table: KeyTable,
) -> dict[int, dict[Any, tuple]]:
    """``id(episode) -> agent_id -> (policy_id, policy batch slice)`` for other_agent_batches."""
    by_episode: dict[int, dict[Any, tuple]] = {}
    for policy_id, (_, segments) in built.items():
        batch = in_key_order[policy_id]
        for key, start, stop in segments.table.tolist():
            episode = key_table.episode[key]
            agent_id = key_table.agent_id[key]
            by_episode.setdefault(id(episode), {})[agent_id] = (policy_id, batch.rows_slice(start, stop))
    return by_episode
