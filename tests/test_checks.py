"""check_batch_invariants: what it accepts is what the runner's flag rule allows, what it refuses it names."""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner import BatchInvariantError, SampleBatch, check_batch_invariants


def _trajectory(terminated: list[bool], truncated: list[bool]) -> SampleBatch:
    obs = np.arange(len(terminated) + 1, dtype=np.float32).reshape(-1, 1)
    return SampleBatch(
        {
            "t": np.arange(len(terminated)),
            "eps_id": np.zeros(len(terminated), np.int64),
            "agent_index": np.zeros(len(terminated), np.int64),
            "obs": obs[:-1],
            "new_obs": obs[1:],
            "terminateds": np.array(terminated),
            "truncateds": np.array(truncated),
        }
    )


def test_an_agent_ending_itself_as_the_time_limit_hits_may_be_both_terminated_and_truncated() -> (
    None
):
    # The flag rule: terminated = __all__ terminated or own, truncated = __all__ truncated or own.
    check_batch_invariants(_trajectory([False, False, True], [False, False, True]))


def test_a_done_flag_before_the_last_row_is_named() -> None:
    with pytest.raises(BatchInvariantError, match="episode 0 agent 0: a done flag before"):
        check_batch_invariants(_trajectory([False, True, True], [False, False, True]))
