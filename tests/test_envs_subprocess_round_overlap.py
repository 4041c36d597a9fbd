"""SubprocessVectorEnv's synchronous protocol overlaps the caller's work with the
workers' steps: actions go out in `send_actions`, replies are read as they come,
and a poll still hands the round out exactly as SyncVectorEnv does."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from marl_runner.envs import SubprocessVectorEnv, SyncVectorEnv
from tests.envs import CheapEnv, assert_same

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

WAIT_S = 20.0  # generous: only a broken protocol gets near it


class MarkingEnv(CheapEnv):
    """CheapEnv (2 agents) that touches `mark_dir/<index>-<step>` on every step, and
    sleeps `step_s` first (a sub-env that finishes after the others)."""

    def __init__(self, index: int, mark_dir: str, step_s: float = 0.0) -> None:
        super().__init__(num_agents=2, episode_len=50)
        self.index = index
        self.mark_dir = mark_dir
        self.step_s = step_s
        self.steps = 0

    def step(self, actions):
        if self.step_s:
            time.sleep(self.step_s)
        self.steps += 1
        Path(self.mark_dir, f"{self.index}-{self.steps}").touch()
        return super().step(actions)


def marking_env(index: int, mark_dir: str, slow_index: int | None = None) -> MarkingEnv:
    return MarkingEnv(index, mark_dir, step_s=0.2 if index == slow_index else 0.0)


def actions_for(env_ids):
    return {env_id: {"agent_0": 1, "agent_1": 2} for env_id in env_ids}


def test_send_actions_starts_the_workers_before_the_next_poll(tmp_path: Path) -> None:
    make_one = functools.partial(marking_env, mark_dir=str(tmp_path))
    with SubprocessVectorEnv(make_one, 4, seed=0, num_workers=2) as vec:
        vec.poll()
        vec.send_actions(actions_for(range(4)))
        assert vec.stats.step_requests == 2
        deadline = time.monotonic() + WAIT_S
        expected = {f"{env_id}-1" for env_id in range(4)}
        while {p.name for p in tmp_path.iterdir()} != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {p.name for p in tmp_path.iterdir()} == expected  # stepped, no poll yet
        obs = vec.poll()[0]
        assert list(obs) == [0, 1, 2, 3]


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 0, 2, 1]])
def test_poll_hands_out_the_round_in_the_order_the_actions_were_sent(
    tmp_path: Path, order: list[int]
) -> None:
    # Sub-env 0's worker answers last; its results still come first when sent first,
    # and any send order is kept, as SyncVectorEnv keeps it.
    make_one = functools.partial(marking_env, mark_dir=str(tmp_path), slow_index=0)
    sync = SyncVectorEnv(make_one, 4, seed=5)
    with SubprocessVectorEnv(make_one, 4, seed=5, num_workers=2) as vec:
        rounds = []
        for env in (sync, vec):
            env.poll()
            polls = []
            for _ in range(3):
                env.send_actions(actions_for(order))
                polls.append(env.poll())
            rounds.append(polls)
        for poll in rounds[1]:
            for part in poll:
                assert list(part) == order
        assert_same(rounds[0], rounds[1])
    sync.stop()
