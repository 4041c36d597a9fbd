"""What a worker keeps from one reply to the next (`ReplyColumns`, the block writer's plan,
the output checks' cleared keys) never hides a change: envs that hand back the very same
dict objects and change them in place (values, key order, a key swapped for another, a
key added or dropped, a value's type) give exactly what sync gives, types included."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from marl_runner.envs import EnvError, SubprocessVectorEnv, SyncVectorEnv
from marl_runner.envs.shared_buffers import SlotBlock
from tests.envs import CheapEnv, assert_identical, assert_same, play_vector_env
from tests.helpers_slot_blocks import slot_block_pair

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class InPlaceEnv(CheapEnv):
    """CheapEnv (shared flag and info dicts) that changes those very dicts in place.

    Its running truncateds dict starts without agent_3; by step: 2 one obs is float64,
    3 the shared terminateds dict reorders (a key popped and put back), 4 the truncateds
    dict swaps agent_2 for agent_3 (same length), 5 agent_2's shared info dict gains an
    entry, 6 the swap is undone (agent_2 back, now last) and the info emptied again,
    7 a terminated flag becomes the int 0, 8 it is False again, 9 every reward is an int,
    10 truncateds gains agent_3 (one key more), 11 loses it again.
    """

    def __init__(self) -> None:
        super().__init__(num_agents=4, episode_len=13)
        del self._running_truncateds["agent_3"]

    def step(self, actions: dict[str, Any]) -> tuple:
        obs, rewards, terminateds, truncateds, infos = super().step(actions)
        t = self._t
        running_terminateds, running_truncateds = self._running_terminateds, self._running_truncateds
        if t == 2:
            obs = {**obs, "agent_1": obs["agent_1"].astype(np.float64)}
        elif t == 3:
            running_terminateds["agent_0"] = running_terminateds.pop("agent_0")
        elif t == 4:
            del running_truncateds["agent_2"]
            running_truncateds["agent_3"] = False
        elif t == 5:
            self._infos["agent_2"]["hit"] = 1
        elif t == 6:
            del running_truncateds["agent_3"]
            running_truncateds["agent_2"] = False
            self._infos["agent_2"].clear()
        elif t == 7:
            running_terminateds["agent_1"] = 0
        elif t == 8:
            running_terminateds["agent_1"] = False
        elif t == 9:
            rewards = dict.fromkeys(rewards, 1)
        elif t == 10:
            running_truncateds["agent_3"] = False
        elif t == 11:
            del running_truncateds["agent_3"]
        return obs, rewards, terminateds, truncateds, infos


def in_place_env(index: int) -> InPlaceEnv:
    return InPlaceEnv()


class SnapshotSyncVectorEnv(SyncVectorEnv):
    """Sync hands out the env's own dicts, which InPlaceEnv changes later: keep copies."""

    def poll(self):
        return copy.deepcopy(super().poll())

    def try_reset(self, env_id, **kwargs):
        return copy.deepcopy(super().try_reset(env_id, **kwargs))


def test_dicts_changed_in_place_reach_the_parent_as_sync_gives_them():
    sync = SnapshotSyncVectorEnv(in_place_env, 6, seed=3)
    with SubprocessVectorEnv(in_place_env, 6, seed=3, num_workers=2) as sub:
        expected, got = play_vector_env(sync, 30), play_vector_env(sub, 30)
        assert_identical(expected, got)
        assert sub.stats.pickled_env_steps > 0  # the misfits went pickled ...
        assert sub.stats.pickled_env_steps < sub.stats.env_steps // 2  # ... the rest did not
    sync.stop()


@pytest.fixture
def blocks():
    """A worker's block (writer side) and the parent's view of it, for 2 sub-envs."""
    with slot_block_pair(num_agents=3, obs_dim=2, num_envs=2) as pair:
        yield pair


def write_and_read(writer: SlotBlock, reader: SlotBlock, results: list[list]) -> tuple[bool, list]:
    """One reply as a worker sends it and the parent reads it: whether it went into the
    block in one pass, and the results read back (those that did not fit: as pickled)."""
    if writer.write_results([0, 1], results):
        return True, [list(column) for column in zip(*reader.columns(reader.read_results(), [0, 1]))]
    new: list[tuple[int, tuple]] = []
    fits = [writer.write_result(env, result, new) for env, result in enumerate(results)]
    for number, keys in new:
        reader.in_sets.learn(number, keys)
    copies = reader.read_results()
    return False, [
        reader.result(copies, env) if fit else result
        for env, (fit, result) in enumerate(zip(fits, results))
    ]


def test_the_writer_reads_every_reply_afresh_when_the_same_dicts_change(blocks):
    """The same flag and info dict objects in every reply, changed between replies: each
    reply reads back as it was then, in its own key order, with its own value types."""
    writer, reader = blocks
    agents = ("agent_0", "agent_1", "agent_2")
    flags = [{**dict.fromkeys(agents, False), "__all__": False} for _ in range(2)]
    infos = [{agent: {} for agent in agents} for _ in range(2)]

    def reorder() -> None:
        flags[0]["agent_0"] = flags[0].pop("agent_0")

    def drop_a_key() -> None:
        flags[1]["agent_1"] = False
        del flags[1]["agent_2"]

    changes = [  # (change, whether the reply then goes in one pass)
        (lambda: None, False),  # new key sets: numbered sub-env by sub-env
        (lambda: None, True),
        (lambda: None, True),  # the same keys and types again: the writer's plan holds
        (lambda: flags[1].update(agent_1=True), True),  # a value set in place
        (reorder, False),  # the same keys in another order: a new key set
        (reorder, True),
        (lambda: infos[1]["agent_2"].update(seen=1), False),  # a shared inner info dict
        (lambda: infos[1]["agent_2"].clear(), True),
        (lambda: flags[1].update(agent_1=1), False),  # an int flag: not a bool
        (drop_a_key, False),
        (lambda: None, True),
    ]
    for step, (change, in_one_pass) in enumerate(changes):
        change()
        results = [
            [
                {agent: np.full(2, step + env, np.float32) for agent in agents},
                {agent: float(step) for agent in agents},
                flags[env],
                flags[env],
                infos[env],
            ]
            for env in range(2)
        ]
        went, got = write_and_read(writer, reader, results)
        assert went is in_one_pass, step
        assert_identical(got, results)


class GhostInPlaceEnv(CheapEnv):
    """Adds an agent it never declared to its shared terminateds dict at step 4."""

    def __init__(self, index: int) -> None:
        super().__init__(num_agents=3, episode_len=20)
        self.index = index

    def step(self, actions):
        if self.index == 1 and self._t == 3:
            self._running_terminateds["ghost"] = False
        return super().step(actions)


def test_an_undeclared_agent_added_in_place_after_good_rounds_is_named():
    with SubprocessVectorEnv(GhostInPlaceEnv, 4, seed=0, num_workers=2) as vec:
        play_vector_env(vec, 4)  # the reset poll and three steps: cleared by then
        vec.send_actions({env_id: {} for env_id in range(4)})
        with pytest.raises(EnvError, match=r"sub-env 1 .*'ghost'"):
            vec.poll()


def test_action_dicts_are_new_each_request_and_keep_the_key_order(blocks):
    writer, reader = blocks
    order = ("agent_2", "agent_0", "agent_1")
    handed_out = []
    for round_ in range(2):
        request = [(env, dict(zip(order, [round_, env, 2]))) for env in range(2)]
        assert reader.write_request({0: 0, 1: 1}, request)
        for number, keys in reader.take_unsent():
            writer.in_sets.learn(number, keys)
        envs, actions = writer.read_actions()
        assert envs == [0, 1]
        assert_same(actions, [sent for _, sent in request])
        assert all(type(value) is int for value in actions[0].values())
        handed_out.extend(actions)
    assert len({id(given) for given in handed_out}) == 4
    assert handed_out[0] == dict(zip(order, [0, 0, 2]))  # an env may keep its dict
