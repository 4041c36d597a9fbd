"""A worker's slot block and the parent's view of it, for tests of the shared-memory path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from marl_runner.envs.shared_buffers import SlotBlock, layout_spec
from tests.envs import CheapEnv


@contextmanager
def slot_block_pair(
    num_agents: int, obs_dim: int, num_envs: int
) -> Iterator[tuple[SlotBlock, SlotBlock]]:
    """``(writer, reader)`` over one block laid out for ``num_envs`` CheapEnvs; both closed
    (and the block unlinked) afterwards."""
    spec = layout_spec(CheapEnv(num_agents=num_agents, obs_dim=obs_dim), num_envs=num_envs)
    writer = SlotBlock.create(spec, None)
    reader = SlotBlock.attach(spec, writer.name)
    try:
        yield writer, reader
    finally:
        reader.close()
        writer.close(unlink=True)
