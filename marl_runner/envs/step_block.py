"""Step results of many sub-envs as arrays, so the runner can skip per-sub-env dicts.

A subprocess worker's reply already sits in one shared array ``[sub-envs,
agents, ...]``. Cut into one obs dict per sub-env, it is stacked again by
the runner one policy group at a time: with 64 sub-envs of 8 agents, 512
array views and 128 dicts made and read back every round. A ``StepBlock``
hands the reply over as it is; ``BaseEnv.poll_blocks`` gives each of its
sub-envs a ``BlockRow`` entry, and whoever needs dicts gets them from
``StepBlock.output``.
"""

from __future__ import annotations

from itertools import repeat
from typing import NamedTuple

import numpy as np


class StepBlock:
    """The step results of sub-envs ``env_ids`` that all look alike.

    Each sub-env is observed by exactly ``agent_ids`` (in that order) and
    rewards exactly those agents. No flag is set and no info is given.
    ``obs[i, j]`` is what agent ``agent_ids[j]`` of sub-env ``env_ids[i]``
    observes, and ``rewards[i, j]`` (float64) its reward. Both arrays belong
    to the block: they are copies, never views of shared memory.
    ``terminateds``, ``truncateds`` and ``infos`` are the one dict each
    sub-env's result carries (all-False flags, empty infos). They are shared
    and read-only.
    """

    __slots__ = ("env_ids", "agent_ids", "obs", "rewards", "terminateds", "truncateds", "infos")

    def __init__(
        self,
        env_ids: list[int],
        agent_ids: tuple,
        obs: np.ndarray,
        rewards: np.ndarray,
        terminateds: dict,
        truncateds: dict,
        infos: dict,
    ) -> None:
        agent_ids = tuple(agent_ids)
        if obs.shape[:2] != (len(env_ids), len(agent_ids)) or rewards.shape != obs.shape[:2]:
            raise ValueError(
                f"StepBlock of {len(env_ids)} sub-envs x {len(agent_ids)} agents: got obs "
                f"{obs.shape} and rewards {rewards.shape}; expected both to start with "
                f"({len(env_ids)}, {len(agent_ids)})"
            )
        # The runner trusts what a block is (no flag, no info): one check per block.
        if any(terminateds.values()) or any(truncateds.values()) or any(infos.values()):
            raise ValueError(
                f"StepBlock of sub-envs {env_ids}: terminateds {terminateds}, truncateds "
                f"{truncateds}, infos {infos}; expected no flag set and no info (a sub-env "
                "that ends or gives infos must come as dicts)"
            )
        self.env_ids = env_ids
        self.agent_ids = agent_ids
        self.obs = obs
        self.rewards = np.asarray(rewards, np.float64)
        self.terminateds = terminateds
        self.truncateds = truncateds
        self.infos = infos

    def output(self, index: int) -> tuple[dict, dict, dict, dict, dict]:
        """``(obs, rewards, terminateds, truncateds, infos)`` of sub-env ``env_ids[index]``,
        as ``BaseEnv.poll`` hands them out (rewards as Python floats)."""
        agent_ids = self.agent_ids
        return (
            dict(zip(agent_ids, self.obs[index])),
            dict(zip(agent_ids, self.rewards[index].tolist())),
            self.terminateds,
            self.truncateds,
            self.infos,
        )

    def poll_parts(self) -> list[tuple[dict, dict, dict, dict, dict, dict]]:
        """Every sub-env's ``output`` plus an empty off-policy actions dict, in ``env_ids``
        order: all six parts of a poll, made in C-level passes over the whole block."""
        count, agent_ids = len(self.env_ids), self.agent_ids
        return list(
            zip(
                map(dict, map(zip, repeat(agent_ids, count), self.obs)),
                map(dict, map(zip, repeat(agent_ids, count), self.rewards.tolist())),
                repeat(self.terminateds, count),
                repeat(self.truncateds, count),
                repeat(self.infos, count),
                map(dict, repeat((), count)),
            )
        )

    def rows(self) -> list[BlockRow]:
        """One ``BlockRow`` per sub-env, in ``env_ids`` order (``_make`` builds them in C:
        ~40 % less than calling the class, on every reply)."""
        count = len(self.env_ids)
        return list(map(BlockRow._make, zip(repeat(self, count), range(count))))


class BlockRow(NamedTuple):
    """A sub-env's entry in ``poll_blocks``' obs dict: its row of a ``StepBlock``."""

    block: StepBlock
    index: int

    def output(self) -> tuple[dict, dict, dict, dict, dict]:
        """This sub-env's result as dicts (``StepBlock.output``)."""
        return self.block.output(self.index)


def materialize(poll: tuple[dict, ...]) -> tuple[dict, ...]:
    """``poll`` (six dicts, as ``poll_blocks`` gives them) with every ``BlockRow`` made
    into dicts, in the obs dict's order; ``poll`` itself when it holds none."""
    obs = poll[0]
    if not any(type(entry) is BlockRow for entry in obs.values()):
        return poll
    made: dict[int, list] = {}  # id(block) -> its outputs, made once per block
    out: tuple[dict, ...] = ({}, {}, {}, {}, {}, {})
    for env_id, entry in obs.items():
        if type(entry) is BlockRow:
            block = entry.block
            outputs = made.get(id(block))
            if outputs is None:
                outputs = made[id(block)] = block.poll_parts()
            for part, value in zip(out, outputs[entry.index]):
                part[env_id] = value
            continue
        for part, given in zip(out, poll):
            if env_id in given:
                part[env_id] = given[env_id]
    return out
