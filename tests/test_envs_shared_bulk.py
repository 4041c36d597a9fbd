"""Whole step messages through a slot block in one pass (shared_bulk): the same results as
the per-sub-env path, what it cannot take left to that path, and output checks once per
request that still catch every bad value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marl_runner.envs import EnvError, SubprocessVectorEnv, SyncVectorEnv
from marl_runner.envs.checks import EnvOutputCheck
from marl_runner.envs.subprocess_checks import RequestChecks
from marl_runner.envs.subprocess_protocol import Crash, Malformed
from tests.envs import CheapEnv, assert_same, play_vector_env
from tests.helpers_slot_blocks import slot_block_pair

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

AGENTS = ("agent_0", "agent_1", "agent_2", "agent_3")


@pytest.fixture
def blocks():
    """A worker's block (writer side) and the parent's view of it, for 3 sub-envs."""
    with slot_block_pair(num_agents=4, obs_dim=3, num_envs=3) as pair:
        yield pair


def step_result(env: int, keys=AGENTS, done=False, reward=0.5):
    """A well-formed step result of `keys`, with values that differ per sub-env."""
    rows = np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * env
    return [
        {key: rows[int(key[-1])] for key in keys},
        {key: reward + env + int(key[-1]) for key in keys},
        {**dict.fromkeys(keys, False), "__all__": False},
        {**dict.fromkeys(keys, done), "__all__": done},
        {key: {} for key in keys},
    ]


def number_key_sets(writer, reader, results):
    """The per-sub-env path numbers new key sets; the parent learns them."""
    new = []
    for env, result in enumerate(results):
        assert writer.write_result(env, result, new)
    for number, keys in new:
        reader.in_sets.learn(number, keys)


def test_a_whole_reply_in_one_pass_reads_back_as_it_went(blocks):
    writer, reader = blocks
    odd_order = ("agent_3", "agent_1", "agent_0", "agent_2")
    first = [step_result(0), step_result(1, odd_order), step_result(2, done=True)]
    number_key_sets(writer, reader, first)
    results = [step_result(2, odd_order), step_result(0), step_result(1, done=True)]
    assert writer.write_results([2, 0, 1], results)
    columns = reader.columns(reader.read_results(), [2, 0, 1])
    assert_same([list(column) for column in zip(*columns)], results)
    # A reply in which every sub-env has the same key sets is read in one pass too.
    same = [step_result(env, odd_order) for env in range(3)]
    assert writer.write_results([0, 1, 2], same)
    held = reader.columns(reader.read_results(), [0, 1, 2])
    assert_same([list(column) for column in zip(*held)], same)
    # What was handed out is the parent's: the next reply does not change it.
    assert writer.write_results([0, 1, 2], [step_result(env + 7, odd_order) for env in range(3)])
    reader.columns(reader.read_results(), [0, 1, 2])
    assert_same([list(column) for column in zip(*held)], same)
    for obs in held[0]:
        for value in obs.values():
            assert not np.shares_memory(value, writer.layout.obs.arrays[0])


def test_what_the_one_pass_cannot_take_goes_to_the_per_sub_env_path(blocks):
    writer, reader = blocks
    number_key_sets(writer, reader, [step_result(env) for env in range(3)])
    good = [step_result(env) for env in range(3)]
    misfits = {
        "a new key set": (0, [{"agent_0": good[0][0]["agent_0"]}, *good[0][1:]]),
        "float64 obs": (1, [{k: v.astype(np.float64) for k, v in good[1][0].items()}, *good[1][1:]]),
        "int rewards": (2, [good[2][0], dict.fromkeys(AGENTS, 1), *good[2][2:]]),
        "int flags": (0, [*good[0][:2], {**dict.fromkeys(AGENTS, 0), "__all__": False}, *good[0][3:]]),
        "an info": (1, [*good[1][:4], {**good[1][4], "agent_2": {"hit": 1}}]),
    }
    for what, (env, result) in misfits.items():
        results = list(good)
        results[env] = result
        assert not writer.write_results([0, 1, 2], results), what
    # Rows with other key sets per sub-env are read one by one, with the same outcome.
    results = [step_result(0, AGENTS[:2]), step_result(1), step_result(2)]
    number_key_sets(writer, reader, results)
    columns = reader.columns(reader.read_results(), [0, 1, 2])
    assert_same([list(column) for column in zip(*columns)], results)


def test_a_whole_request_in_one_pass_and_actions_it_leaves_to_the_per_sub_env_path(blocks):
    writer, reader = blocks
    order = ("agent_0", "agent_2", "agent_1", "agent_3")
    for actions in (
        [(1, dict(zip(order, [1, 2, 3, 4]))), (0, dict(zip(order, [0, 1, 0, 1])))],
        [(0, dict(zip(order, [4, 4, 4, 4]))), (2, dict(zip(order, [3, 2, 1, 0])))],
        [(2, dict(zip(order, np.arange(4))))],  # numpy ints: the per-sub-env path
    ):
        assert reader.write_request({0: 0, 1: 1, 2: 2}, actions)
        for number, keys in reader.take_unsent():
            writer.in_sets.learn(number, keys)
        assert_same(list(zip(*writer.read_actions())), actions)
    assert not reader.write_request({0: 0}, [(0, dict(zip(order, [1, True, 0, 0])))])


def test_flags_all_false_and_empty_infos_are_read_as_shared_dicts(blocks):
    """Read-only, as an env's own may be (CheapEnv shares its own between steps)."""
    writer, reader = blocks
    number_key_sets(writer, reader, [step_result(env) for env in range(3)])
    assert writer.write_results([0, 1, 2], [step_result(env) for env in range(3)])
    _, rewards, terminateds, truncateds, infos = reader.columns(reader.read_results(), [0, 1, 2])
    assert terminateds[0] is terminateds[2] and infos[0] is infos[1]
    assert rewards[0] is not rewards[1] and rewards[0] == step_result(0)[1]
    assert truncateds[0] == {**dict.fromkeys(AGENTS, False), "__all__": False}


def request_checks(num_envs: int, check_spaces: bool = False) -> RequestChecks:
    envs = {env_id: CheapEnv(num_agents=4, obs_dim=3) for env_id in range(num_envs)}
    checks = {env_id: EnvOutputCheck(env, env_id, check_spaces) for env_id, env in envs.items()}
    return RequestChecks(checks, check_spaces, lambda error, env_id: Crash(error))


def test_output_checks_once_per_request_still_catch_a_bad_value_after_good_rounds():
    checks = request_checks(3)
    for _ in range(2):  # the second time: cleared key tuples, one sum of all rewards
        results = [step_result(env) for env in range(3)]
        checks.check_many([0, 1, 2], results)
        assert all(type(result) is list for result in results)
    nan = [step_result(0), step_result(1, reward=math.nan), step_result(2)]
    checks.check_many([0, 1, 2], nan)
    assert type(nan[1]) is Malformed and "agent_0" in nan[1].message and "sub-env 1" in nan[1].message
    assert type(nan[0]) is list and type(nan[2]) is list
    ghost = [step_result(env) for env in range(3)]
    ghost[2][2] = {**ghost[2][2], "ghost": True}
    checks.check_many([0, 1, 2], ghost)
    assert type(ghost[2]) is Malformed and "'ghost'" in ghost[2].message


def test_output_checks_of_spaces_run_for_every_result():
    checks = request_checks(1, check_spaces=True)
    for _ in range(2):
        results = [step_result(0)]
        results[0][0] = {key: np.zeros(3, np.float32) for key in AGENTS}
        checks.check_many([0], results)
        assert type(results[0]) is list
    results[0][0]["agent_1"] = np.full(3, 5.0, np.float32)  # outside Box(-1, 1)
    checks.check_many([0], results)
    assert type(results[0]) is Malformed and "agent_1" in results[0].message


class LateNanEnv(CheapEnv):
    """Agent 1's reward is NaN at step 5 of sub-env 1: after four rounds of good output."""

    def __init__(self, index: int) -> None:
        super().__init__(num_agents=3, episode_len=20)
        self.index = index

    def step(self, actions):
        obs, rewards, *rest = super().step(actions)
        if self.index == 1 and self._t == 5:
            rewards = {**rewards, "agent_1": float("nan")}
        return (obs, rewards, *rest)


def test_a_bad_reward_after_good_rounds_raises_in_the_parent_naming_sub_env_and_agent():
    with SubprocessVectorEnv(LateNanEnv, 4, seed=0, num_workers=2) as vec:
        play_vector_env(vec, 5)  # the reset poll and four steps
        assert vec.stats.pickled_env_steps == 0
        vec.send_actions({env_id: {} for env_id in range(4)})
        with pytest.raises(EnvError, match=r"sub-env 1 .*agent_1"):
            vec.poll()


def test_cheap_env_outputs_equal_syncs_with_every_step_in_one_pass():
    sync = SyncVectorEnv(cheap_env, 6, seed=4)
    with SubprocessVectorEnv(cheap_env, 6, seed=4, num_workers=2) as sub:
        assert_same(play_vector_env(sync, 30), play_vector_env(sub, 30))
        assert sub.stats.pickled_env_steps == 0
    sync.stop()


def cheap_env(index: int) -> CheapEnv:
    return CheapEnv(num_agents=5, episode_len=12)
