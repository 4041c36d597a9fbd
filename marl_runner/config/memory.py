"""What one runner's batch takes in memory, estimated from the config and the agents' spaces.

A runner holds a whole batch before handing it out: ``num_envs`` sub-envs
times ``rollout_fragment_length`` steps, each step a row per acting agent of
its obs, next obs, action and the bookkeeping columns. ``num_envs:
10000000`` or ``rollout_fragment_length: 10**12`` passes every value check
and then grows until the machine runs out; ``check_batch_memory`` refuses it
first, naming the keys. ``validate`` and ``sample`` both call it.

Rows are counted as the env makes them: every possible agent each step in a
parallel env (fewer when agents die), one agent per step in a turn-taking
one; connector columns, infos, the sub-envs and the models are not counted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from marl_runner.config.errors import ConfigError

__all__ = [
    "BatchMemory",
    "check_batch_memory",
    "estimate_batch_memory",
    "format_bytes",
    "format_count",
    "space_bytes",
]

#: Bytes of a row besides obs, next obs and action: rewards and logp (float32), done flags,
#: and eps_id / env_id / agent_index / t (int64); the real rows hold more.
BOOKKEEPING_ROW_BYTES = 4 + 4 + 1 + 1 + 4 * 8


@dataclasses.dataclass(frozen=True)
class BatchMemory:
    """One runner's batch: rows and bytes per row, per policy."""

    num_envs: int
    fragment_length: int
    rows: dict[str, int]
    row_bytes: dict[str, int]

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole batch: what is compared with the memory limit."""
        return sum(self.rows[pid] * self.row_bytes[pid] for pid in self.rows)

    def describe(self) -> str:
        """``policy 'a': 12,800 rows x 140 B`` ..., for messages and ``validate``."""
        return ", ".join(
            f"policy {pid!r}: {format_count(self.rows[pid])} rows x "
            f"{format_count(self.row_bytes[pid])} B"
            for pid in self.rows
        )


def space_bytes(space: gym.Space) -> int:
    """Bytes of one value of ``space`` as a batch column holds it (Dict / Tuple: their parts)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(space_bytes(part) for part in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(space_bytes(part) for part in space.spaces)
    shape = getattr(space, "shape", None) or ()
    dtype = getattr(space, "dtype", None)
    itemsize = dtype.itemsize if dtype is not None else 8
    return max(1, math.prod(shape)) * itemsize


def estimate_batch_memory(
    config: Any,
    agents: Sequence[tuple[str, gym.Space, gym.Space]] = (),
    *,
    all_agents_act: bool = False,
) -> BatchMemory:
    """The batch of one runner under ``config``, for the env's possible ``agents``
    (``(policy id, obs space, action space)`` each).

    Rows: ``num_envs x rollout_fragment_length`` env steps, each with a row for every
    agent when ``all_agents_act`` (a parallel env), else for one agent (turn-taking
    envs; and always so when steps count agent steps), shared out by agent count.
    Without ``agents`` (not known yet), one row per step of bookkeeping only.
    """
    steps = config.num_envs * config.rollout_fragment_length
    if not agents:
        return BatchMemory(
            config.num_envs,
            config.rollout_fragment_length,
            {"*": steps},
            {"*": BOOKKEEPING_ROW_BYTES},
        )
    per_step = len(agents) if all_agents_act and config.count_steps_by == "env_steps" else 1
    counts: dict[str, int] = {}
    row_bytes: dict[str, int] = {}
    obs_copies = 1 if "new_obs" in config.exclude_columns else 2  # obs, and new_obs unless left out
    for policy_id, obs_space, action_space in agents:
        counts[policy_id] = counts.get(policy_id, 0) + 1
        size = (
            obs_copies * space_bytes(obs_space) + space_bytes(action_space) + BOOKKEEPING_ROW_BYTES
        )
        row_bytes[policy_id] = min(row_bytes.get(policy_id, size), size)
    rows = {pid: steps * per_step * n // len(agents) for pid, n in counts.items()}
    return BatchMemory(config.num_envs, config.rollout_fragment_length, rows, row_bytes)


def check_batch_memory(estimate: BatchMemory, limit_bytes: int) -> None:
    """Raises ``ConfigError`` when one runner's batch cannot fit in ``limit_bytes``."""
    if estimate.total_bytes <= limit_bytes:
        return
    raise ConfigError(
        None,
        f"one batch needs about {format_bytes(estimate.total_bytes)} (num_envs "
        f"{format_count(estimate.num_envs)} x rollout_fragment_length "
        f"{format_count(estimate.fragment_length)}; "
        f"{estimate.describe()}), more than the {format_bytes(limit_bytes)} this process may "
        "use; lower num_envs or rollout_fragment_length",
    )


def format_bytes(count: int) -> str:
    """``1.2 GiB``: a byte count for messages (a config's ints have no bound, floats have)."""
    if count >= _HUGE:
        return f"{format_count(count)} B"
    value, unit = float(count), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:,.0f} B" if unit == "B" else f"{value:,.1f} {unit}"


def format_count(count: int) -> str:
    """``12,800``; a count past 10**18 (thousands of digits at worst) as its power of ten."""
    return f"{count:,}" if count < 10**18 else f"~10^{int(count.bit_length() * 0.30103)}"


#: Byte counts at least this large are past PiB and float's range may not hold them.
_HUGE = 1024**6
