"""Per-trajectory post-processing of built batches (e.g. GAE), for policies and callbacks that ask."""

from __future__ import annotations

from typing import Any

import numpy as np

from marl_runner.batch import SampleBatch, concat_samples
from marl_runner.trajectories import KeyTable


def postprocess_trajectories(
    built: dict[str, tuple[SampleBatch, np.ndarray]],
    runner: Any,
    key_table: KeyTable,
    wants_hook: bool,
) -> dict[str, SampleBatch]:
    """Splits each policy batch into agent trajectories only when someone looks at them.

    ``built`` maps policy id to (batch, segments of (key, start, stop)). A
    policy's ``postprocess_trajectory`` gets each trajectory with the other
    agents' trajectories of the same episode; ``on_postprocess_trajectory``
    callbacks (``wants_hook``) may edit the result in place.
    """
    result = {}
    by_episode = None
    for policy_id, (batch, segments) in built.items():
        entry = runner._entries.get(policy_id)
        wants_policy = entry is not None and entry.wants_postprocess
        if not (wants_hook or wants_policy):
            result[policy_id] = batch
            continue
        if by_episode is None:
            by_episode = _trajectories_by_episode(built, key_table)
        pieces = []
        for key, start, stop in segments.tolist():
            trajectory = batch.rows_slice(start, stop)
            episode = key_table.episode[key]
            agent_id = key_table.agent_id[key]
            others = {a: v for a, v in by_episode.get(id(episode), {}).items() if a != agent_id}
            if wants_policy:
                trajectory = entry.policy.postprocess_trajectory(trajectory, others, episode)
            if wants_hook:
                runner.callbacks.on_postprocess_trajectory(
                    runner=runner, worker=runner, episode=episode, agent_id=agent_id,
                    policy_id=policy_id, policies=runner.policy_map,
                    postprocessed_batch=trajectory, original_batches=others,
                )
            pieces.append(trajectory)
        result[policy_id] = concat_samples(pieces)
    return result


def _trajectories_by_episode(
    built: dict[str, tuple[SampleBatch, np.ndarray]], key_table: KeyTable
) -> dict[int, dict[Any, tuple]]:
    """``id(episode) -> agent_id -> (policy_id, policy batch slice)`` for other_agent_batches."""
    by_episode: dict[int, dict[Any, tuple]] = {}
    for policy_id, (batch, segments) in built.items():
        for key, start, stop in segments.tolist():
            episode = key_table.episode[key]
            agent_id = key_table.agent_id[key]
            by_episode.setdefault(id(episode), {})[agent_id] = (policy_id, batch.rows_slice(start, stop))
    return by_episode
