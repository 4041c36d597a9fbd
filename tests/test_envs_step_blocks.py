"""SubprocessVectorEnv.poll_blocks: a reply whose sub-envs all look alike comes as one
StepBlock (a BlockRow per sub-env), which materializes to exactly what poll hands out;
any other reply comes as dicts, and the block's arrays are the caller's to keep."""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner.bench.envs.scripted_env import every_round_script
from marl_runner.envs import SubprocessVectorEnv, SyncVectorEnv
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.step_block import BlockRow, StepBlock, materialize
from tests.envs import (
    CheapEnv,
    CrashingEnv,
    DictObsEnv,
    MaskInfoEnv,
    Round,
    ScriptedEnv,
    assert_identical,
    assert_same,
    play_vector_env,
)
from tests.helpers_slot_blocks import slot_block_pair
from tests.test_envs_subprocess_vector import play_per_env

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

A = ("a0", "a1")
#: One episode, round by round (round 0 is the reset); rounds 1 and 5 fit a StepBlock.
QUIRKS = [
    Round(A),
    Round(A, {"a0": 0.5, "a1": 1.5}),
    Round(A, {"a1": 1.0, "a0": 2.0}),  # rewards in another key order than the obs
    Round(A, {"a0": 1.0}),  # rewards for one of the two observed agents
    Round(A, {"a0": 1.0, "a1": 0.25}, terminated=("a1",)),  # a flag set
    Round(("a0",), {"a0": 3.0}),
    Round(("a0",), {"a0": 1.0}, truncated=("a0",), end="truncated"),
]
EPISODE = len(QUIRKS) - 1


def cheap(index: int) -> CheapEnv:
    return CheapEnv(num_agents=3, episode_len=4, obs_dim=5)


def quirky(index: int) -> ScriptedEnv:
    """Sub-env 0 plays a plain episode; the others play QUIRKS (as long)."""
    return ScriptedEnv(every_round_script(A, EPISODE) if index == 0 else QUIRKS, A)


def crashing(index: int) -> CrashingEnv:
    """Sub-env 1 crashes on step 3 of each episode; the others never crash."""
    return CrashingEnv(crash_step=3 if index == 1 else None, episode_len=5)


class BlockPolls:
    """A vector env read through `poll_blocks`: `poll` materializes it, and
    `block_rows` lists per poll the sub-envs that came as BlockRows."""

    def __init__(self, vec: SubprocessVectorEnv) -> None:
        self.vec = vec
        self.block_rows: list[dict[int, BlockRow]] = []

    def poll(self) -> tuple[dict, ...]:
        polled = self.vec.poll_blocks()
        rows = {env_id: row for env_id, row in polled[0].items() if type(row) is BlockRow}
        for part in polled[1:]:
            assert part.keys().isdisjoint(rows), "a BlockRow's sub-env is in another dict"
        self.block_rows.append(rows)
        return materialize(polled)

    def __getattr__(self, name: str):
        return getattr(self.vec, name)


def test_cheap_env_steady_rounds_are_block_rows_that_materialize_to_poll():
    sync = play_vector_env(SyncVectorEnv(cheap, 4, seed=1), 15)
    with (
        SubprocessVectorEnv(cheap, 4, seed=1, num_workers=2) as with_blocks,
        SubprocessVectorEnv(cheap, 4, seed=1, num_workers=2) as with_dicts,
    ):
        blocks = BlockPolls(with_blocks)
        from_blocks = play_vector_env(blocks, 15)
        assert_identical(from_blocks, play_vector_env(with_dicts, 15))
    assert_same(sync, from_blocks)
    # From the first step on (its reply numbers the key sets, pickled beside the block),
    # every sub-env comes as a BlockRow except on the round its episode ends (its reset
    # travels pickled with the reply, and the worker's other sub-envs still come as rows).
    assert blocks.block_rows[0] == {}
    ended = 0
    for (poll, _), rows in zip(from_blocks[1:], blocks.block_rows[1:]):
        for env_id in poll[0]:
            assert (env_id in rows) != poll[3][env_id]["__all__"], (env_id, rows)
            ended += poll[3][env_id]["__all__"]
    assert ended == 4 * 3  # 14 steps: three episode ends per sub-env
    assert sum(map(len, blocks.block_rows)) == 4 * 14 - ended


def test_replies_that_do_not_look_alike_come_as_dicts_equal_to_sync():
    rounds = 1 + 3 * EPISODE
    sync = play_vector_env(SyncVectorEnv(quirky, 4, seed=2), rounds)
    with SubprocessVectorEnv(quirky, 4, seed=2, num_workers=2) as vec:
        blocks = BlockPolls(vec)
        assert_same(sync, play_vector_env(blocks, rounds))
    # Worker 1 (sub-envs 2, 3: QUIRKS) gives blocks on rounds 1 and 5 only. Worker 0 only on
    # round 1: sub-env 0's codes differ from sub-env 1's after it, and on round 4 sub-env
    # 1's set flag keeps the whole reply out. The first episode numbers key sets.
    fits = {0: {1}, 1: {1}, 2: {1, 5}, 3: {1, 5}}
    for poll_index in range(1 + EPISODE, rounds):
        in_episode = (poll_index - 1) % EPISODE + 1
        rows = blocks.block_rows[poll_index]
        assert set(rows) == {e for e in range(4) if in_episode in fits[e]}, (in_episode, rows)


@pytest.mark.parametrize(
    "make_one",
    [
        pytest.param(lambda: DictObsEnv(), id="dict-obs"),
        pytest.param(lambda: MaskInfoEnv(), id="infos"),
        pytest.param(
            lambda: EnvFactory({"name": "pettingzoo.classic.connect_four_v3:env", "api": "aec"}),
            id="connect_four",
        ),
    ],
)
def test_dict_obs_and_infos_never_come_as_blocks(make_one):
    factory = make_one()
    if not isinstance(factory, EnvFactory):
        factory = EnvFactory({"name": f"tests.envs:{type(factory).__name__}"})
    sync = play_vector_env(SyncVectorEnv(factory, 2, seed=5), 14)
    with SubprocessVectorEnv(factory, 2, seed=5, num_workers=2) as vec:
        blocks = BlockPolls(vec)
        assert_same(sync, play_vector_env(blocks, 14))
    assert not any(blocks.block_rows)


def test_a_block_is_the_callers_to_keep():
    with SubprocessVectorEnv(cheap, 4, seed=1, num_workers=2) as vec:
        vec.poll()
        act = {env_id: dict.fromkeys(cheap(0).possible_agents, 0) for env_id in range(4)}
        vec.send_actions(act)
        vec.poll()  # the key sets' first round: pickled
        vec.send_actions(act)
        kept = {row.block for row in vec.poll_blocks()[0].values()}
        assert len(kept) == 2  # one per worker
        values = [(block.obs.copy(), block.rewards.copy()) for block in kept]
        for worker in vec._workers:
            for block in kept:
                assert not np.shares_memory(block.obs, worker.slots.layout.obs.arrays[0])
                assert not np.shares_memory(block.rewards, worker.slots.layout.rewards)
        vec.send_actions(act)
        later = vec.poll_blocks()[0]
        assert kept.isdisjoint(row.block for row in later.values())
        for block, (obs, rewards) in zip(kept, values):
            np.testing.assert_array_equal(block.obs, obs)
            np.testing.assert_array_equal(block.rewards, rewards)
            assert block.obs.dtype == np.float32 and block.rewards.dtype == np.float64
            assert not np.array_equal(block.obs, later[block.env_ids[0]].output()[0]["agent_0"])


@pytest.mark.parametrize("num_envs_per_poll", [1, 3])
def test_async_pools_blocks_materialize_to_what_sync_gives_each_sub_env(num_envs_per_poll):
    sync = play_per_env(SyncVectorEnv(cheap, 4, seed=3), 12)
    with SubprocessVectorEnv(
        cheap, 4, seed=3, num_workers=2, num_envs_per_poll=num_envs_per_poll
    ) as vec:
        blocks = BlockPolls(vec)
        assert_same(sync, play_per_env(blocks, 12))
    assert any(blocks.block_rows)


def test_crashes_among_block_replies_match_sync():
    sync = play_vector_env(SyncVectorEnv(crashing, 4, seed=4), 16)
    with SubprocessVectorEnv(crashing, 4, seed=4, num_workers=2) as vec:
        blocks = BlockPolls(vec)
        assert_same(sync, play_vector_env(blocks, 16))
    assert any(2 in rows and 3 in rows for rows in blocks.block_rows)


def test_block_rows_come_in_the_order_the_actions_were_sent():
    agents = cheap(0).possible_agents
    order = [3, 1, 2, 0]
    with (
        SubprocessVectorEnv(cheap, 4, seed=1, num_workers=2) as with_blocks,
        SubprocessVectorEnv(cheap, 4, seed=1, num_workers=2) as with_dicts,
    ):
        for _ in range(3):
            polled = with_blocks.poll_blocks()
            assert_identical(materialize(polled), with_dicts.poll())
            actions = {env_id: dict.fromkeys(agents, 1) for env_id in order}
            with_blocks.send_actions(actions)
            with_dicts.send_actions(actions)
        polled = with_blocks.poll_blocks()
        assert list(polled[0]) == order
        assert all(type(row) is BlockRow for row in polled[0].values())
        assert_identical(materialize(polled), with_dicts.poll())


def test_a_block_replaces_what_an_earlier_reply_of_its_sub_envs_left():
    """Stepped twice before a poll (the episode's end, then the next episode's first
    step): the poll holds the block only, not the ended step's dicts."""
    agents = CheapEnv(num_agents=2, episode_len=2).possible_agents
    act = {env_id: dict.fromkeys(agents, 0) for env_id in range(2)}
    with SubprocessVectorEnv(two_round_episodes, 2, seed=1, num_workers=1) as vec:
        vec.poll()
        vec.send_actions(act)
        vec.poll()  # step 1: numbers the key sets
        vec.send_actions(act)  # step 2 ends the episode; the worker resets it at once
        vec.send_actions(act)  # step 1 of the next episode: one block
        polled = vec.poll_blocks()
    assert all(type(row) is BlockRow for row in polled[0].values()), polled[0]
    assert polled[1:] == ({}, {}, {}, {}, {})
    for _, _, _, truncateds, _, _ in [materialize(polled)]:
        assert not any(flags["__all__"] for flags in truncateds.values())


def two_round_episodes(index: int) -> CheapEnv:
    return CheapEnv(num_agents=2, episode_len=2)


# ---- the reader alone, on one block (no processes)

AGENTS = ("agent_0", "agent_1", "agent_2", "agent_3")


@pytest.fixture
def blocks():
    """A worker's block (writer side) and the parent's view of it, for 3 sub-envs."""
    with slot_block_pair(num_agents=4, obs_dim=3, num_envs=3) as pair:
        yield pair


def step_result(env: int, keys=AGENTS, reward_keys=None, done=False):
    """A well-formed step result of `keys` (rewards for `reward_keys`, default the same),
    with values that differ per sub-env."""
    rows = np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * env
    return [
        {key: rows[int(key[-1])] for key in keys},
        {key: 0.5 + env + int(key[-1]) for key in reward_keys or keys},
        {**dict.fromkeys(keys, False), "__all__": False},
        {**dict.fromkeys(keys, done), "__all__": done},
        {key: {} for key in keys},
    ]


def written(writer, reader, envs, results):
    """`results` of sub-envs `envs` in the block, key sets numbered first as the
    per-sub-env path does (the parent learns them)."""
    new = []
    for env, result in zip(envs, results):
        assert writer.write_result(env, result, new)
    for number, keys in new:
        reader.in_sets.learn(number, keys)


@pytest.mark.parametrize("envs", [[0, 1, 2], [2, 0], [1]])
@pytest.mark.parametrize(
    "keys",
    [AGENTS, ("agent_3", "agent_1", "agent_0", "agent_2"), ("agent_1", "agent_2"), ("agent_2",)],
)
def test_a_block_gives_what_the_dict_path_gives(blocks, envs, keys):
    writer, reader = blocks
    results = [step_result(env, keys) for env in envs]
    written(writer, reader, envs, results)
    env_ids = [10 + env for env in envs]
    block = reader.step_block(envs, env_ids)
    assert type(block) is StepBlock and block.env_ids == env_ids and block.agent_ids == keys
    assert block.obs.shape == (len(envs), len(keys), 3) and block.rewards.dtype == np.float64
    assert not np.shares_memory(block.obs, writer.layout.obs.arrays[0])
    assert not np.shares_memory(block.rewards, writer.layout.rewards)
    columns = reader.columns(reader.read_results(), envs)
    for index in range(len(envs)):
        assert_identical(list(block.output(index)), [column[index] for column in columns])
    assert_same([list(block.output(index)) for index in range(len(envs))], results)


@pytest.mark.parametrize(
    "results",
    [
        pytest.param([step_result(0), step_result(1, done=True)], id="a-flag-set"),
        pytest.param(
            [step_result(0, reward_keys=AGENTS[::-1]), step_result(1, reward_keys=AGENTS[::-1])],
            id="rewards-in-another-order",
        ),
        pytest.param(
            [step_result(0, reward_keys=AGENTS[:2]), step_result(1, reward_keys=AGENTS[:2])],
            id="rewards-for-fewer-agents",
        ),
        pytest.param([step_result(0), step_result(1, AGENTS[:2])], id="sub-envs-unalike"),
    ],
)
def test_no_block_for_a_reply_that_does_not_fit_one(blocks, results):
    writer, reader = blocks
    written(writer, reader, [0, 1], results)
    assert reader.step_block([0, 1], [0, 1]) is None
    assert reader.step_block([], []) is None
