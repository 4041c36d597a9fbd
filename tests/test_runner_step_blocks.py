"""The runner takes ``StepBlock`` rows (``BaseEnv.poll_blocks``) exactly as it takes dicts.

A test backend wraps the sync vector env and hands every run of look-alike
sub-envs over as blocks of a few sub-envs each, cut at random places, so
rounds mix blocks, dicts, fast-path and general-path sub-envs. Its batches
must equal the sync runner's, column for column.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from connectors import AgentConnector
from connectors.data import AgentRows
from marl_runner import EnvRunner, check_batch_invariants
from marl_runner.envs import vector_backends
from marl_runner.envs.base_env import BaseEnv, PollDicts
from marl_runner.envs.step_block import BlockRow, StepBlock, materialize
from marl_runner.envs.vector_backends import VectorBuild, register_vector_backend
from marl_runner.envs.vectorize import build_sync
from marl_runner.sampling.env_output import poll_method
from marl_runner.sampling.stacked_rows import joined_rows
from tests.envs import Round, ScriptedEnv
from tests.runner_helpers import EpisodeTracker, assert_rewards_conserved, config, logged_env_name

CHEAP = "marl_runner.bench.envs.cheap_env:CheapEnv"
KAZ = "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"
SPREAD = "mpe2.simple_spread_v3:parallel_env"
DYING = "tests.envs.lifecycle_envs:DyingAgentsEnv"


class BlockingVectorEnv(BaseEnv):
    """A sync vector env whose look-alike sub-envs come as blocks of at most ``most``, cut
    at random (``cut`` per sub-env), and a share (``as_dicts``) of those that would fit left
    as dicts; ``whole`` makes every run of look-alike sub-envs one block."""

    def __init__(self, inner: BaseEnv, seed: int = 0, whole: bool = False) -> None:
        self.inner = inner
        self.num_envs = inner.num_envs
        self.rng = np.random.default_rng(seed)
        self.most, self.cut, self.as_dicts = (inner.num_envs, 0.0, 0.0) if whole else (3, 0.2, 0.25)
        self.blocks_given = 0
        self.rows_given = 0

    def poll(self) -> PollDicts:
        return self.inner.poll()

    def poll_blocks(self) -> PollDicts:
        polled = self.inner.poll()
        runs: list[list[int]] = []
        for env_id in polled[0]:
            if not _fits_a_block(polled, env_id) or self.rng.random() < self.as_dicts:
                runs.append([])  # as dicts (some that would fit too: runs of both kinds mix)
                continue
            last = runs[-1] if runs else []
            if (
                not last
                or len(last) == self.most
                or self.rng.random() < self.cut
                or not _alike(polled, last[0], env_id)
            ):
                runs.append([env_id])
            else:
                last.append(env_id)
        out = tuple(dict(part) for part in polled)
        for run in runs:
            if not run:
                continue
            block = _block_of(polled, run)
            self.blocks_given += 1
            self.rows_given += len(run)
            for row in block.rows():
                env_id = block.env_ids[row.index]
                out[0][env_id] = row
                for part in out[1:]:
                    part.pop(env_id, None)
        return out

    def send_actions(self, actions: dict) -> None:
        self.inner.send_actions(actions)

    def try_reset(self, env_id: int, *, seed: Any = None, options: Any = None) -> Any:
        return self.inner.try_reset(env_id, seed=seed, options=options)

    def try_restart(self, env_id: int) -> None:
        self.inner.try_restart(env_id)

    def get_sub_environments(self) -> list[Any]:
        return self.inner.get_sub_environments()

    def stop(self) -> None:
        self.inner.stop()

    @property
    def possible_agents(self) -> list:
        return self.inner.possible_agents

    def get_observation_space(self, agent: Any) -> Any:
        return self.inner.get_observation_space(agent)

    def get_action_space(self, agent: Any) -> Any:
        return self.inner.get_action_space(agent)


def _fits_a_block(polled: PollDicts, env_id: int) -> bool:
    obs, rewards, terminateds, truncateds, infos, off_policy = (p.get(env_id) for p in polled)
    if type(obs) is not dict or not obs or off_policy:
        return False
    values = list(obs.values())
    return (
        all(type(v) is np.ndarray and v.shape == values[0].shape for v in values)
        and len({v.dtype for v in values}) == 1
        and set(rewards or {}) == set(obs)
        and not any((terminateds or {}).values())
        and not any((truncateds or {}).values())
        and not any((infos or {}).values())
    )


def _alike(polled: PollDicts, first: int, env_id: int) -> bool:
    a, b = polled[0][first], polled[0][env_id]
    return (
        tuple(a) == tuple(b)
        and next(iter(a.values())).dtype == next(iter(b.values())).dtype
        and all(polled[k].get(first) == polled[k].get(env_id) for k in (2, 3, 4))
    )


def _block_of(polled: PollDicts, env_ids: list[int]) -> StepBlock:
    first = env_ids[0]
    agent_ids = tuple(polled[0][first])
    obs = np.stack([np.stack([polled[0][e][a] for a in agent_ids]) for e in env_ids])
    rewards = np.array([[float(polled[1][e][a]) for a in agent_ids] for e in env_ids])
    flags = [polled[k].get(first) or {} for k in (2, 3, 4)]
    return StepBlock(env_ids, agent_ids, obs, rewards, *flags)


@pytest.fixture
def blocks_backend(monkeypatch: pytest.MonkeyPatch) -> list[BlockingVectorEnv]:
    """``vectorize: blocks_test``: the blocking env around a sync one; those built are listed."""
    monkeypatch.setattr(vector_backends, "_BACKENDS", dict(vector_backends._BACKENDS))
    built: list[BlockingVectorEnv] = []

    for name, whole in (("blocks_test", False), ("whole_blocks_test", True)):

        def build(spec: VectorBuild, whole: bool = whole) -> BaseEnv:
            env = BlockingVectorEnv(build_sync(spec), whole=whole)
            built.append(env)
            return env

        register_vector_backend(name, build, doc="Sync sub-envs given as StepBlocks (tests).")
    return built


def _batches(cfg_args: dict, vectorize: str, steps: int) -> tuple[dict, Any]:
    cfg = config(**cfg_args, vectorize=vectorize)
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_env_steps=steps)
        metrics = runner.get_metrics()
    check_batch_invariants(batch, rollout_fragment_length=cfg.rollout_fragment_length)
    return batch.policy_batches, metrics


class LastObsGoneEnv(ScriptedEnv):
    """a0 and a1 observe alike for six rounds (blocks on the fast path); the episode then
    ends with only a0's obs, so a1's last transition closes on a fake final obs."""

    def __init__(self) -> None:
        both = ("a0", "a1")
        rewarded = {"a0": 1.0, "a1": 0.5}
        script = [Round(both), *[Round(both, rewarded) for _ in range(6)]]
        script.append(Round(("a0",), rewarded, truncated=("a0",), end="truncated"))
        super().__init__(script, both)


class DoubleRawObsInPlace(AgentConnector):
    """A column connector that doubles raw obs in place where the column is an array
    already (a careless user connector): with blocks that array is the block's."""

    def __call__(self, rows: AgentRows) -> AgentRows:
        obs = np.asarray(rows["obs"], dtype=np.float32)
        obs *= 2.0
        rows["obs"] = obs
        return rows


IN_PLACE_CHAIN = [
    {"name": "tests.test_runner_step_blocks:DoubleRawObsInPlace"},
    {"name": "ObsPreprocessorConnector"},
]

CASES = {
    "cheap_two_policies": dict(
        env_name=CHEAP, num_envs=7, rollout_fragment_length=13, seed=5,
        env_config={"num_agents": 6, "episode_len": 9, "obs_dim": 4},
        policies={"even": {"model": {"type": "mlp", "hidden": [8]}}, "odd": {}},
        policy_mapping_fn={"agent_*[02468]": "even", "agent_*": "odd"},
    ),
    "kaz_agents_die": dict(
        env_name=KAZ, num_envs=4, rollout_fragment_length=25, seed=3,
        env_config={"obs_method": "vector", "max_cycles": 60},
        policies={"archer": {"model": {"type": "mlp", "hidden": [16]}}, "knight": {}},
        policy_mapping_fn={"archer_*": "archer", "knight_*": "knight"},
    ),
    "spread_shared_policy": dict(
        env_name=SPREAD, num_envs=5, rollout_fragment_length=10, seed=1,
        env_config={"N": 3, "max_cycles": 7, "continuous_actions": False},
    ),
    "dying_agents_fake_obs_last": dict(
        env_name=DYING, num_envs=3, rollout_fragment_length=10, seed=2, fake_obs="last",
    ),
    # The fake final obs is the agent's last raw obs as the env gave it, not as a
    # connector changed the block it came in.
    "last_obs_gone_connector_in_place": dict(
        env_name="tests.test_runner_step_blocks:LastObsGoneEnv", num_envs=3,
        rollout_fragment_length=10, seed=2, fake_obs="last",
        policies={"shared": {"agent_connectors": IN_PLACE_CHAIN}},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_batches_equal_sync_batches(case: str, blocks_backend: list) -> None:
    sync, sync_metrics = _batches(CASES[case], "sync", 150)
    blocks, block_metrics = _batches(CASES[case], "blocks_test", 150)
    (env,) = blocks_backend
    assert env.blocks_given > 10 and env.rows_given > env.blocks_given
    assert set(sync) == set(blocks)
    for policy_id, batch in sync.items():
        other = blocks[policy_id]
        assert set(batch.keys()) == set(other.keys())
        for column in batch.keys():
            if column == "eps_id":  # random per runner: the same rows share an id in both
                np.testing.assert_array_equal(
                    np.unique(batch[column], return_inverse=True)[1],
                    np.unique(other[column], return_inverse=True)[1],
                )
                continue
            np.testing.assert_array_equal(batch[column], other[column], err_msg=column)
    for key in ("episodes", "num_agent_steps", "num_env_steps", "episode_reward_mean"):
        np.testing.assert_equal(sync_metrics[key], block_metrics[key], err_msg=key)


def test_a_connector_changing_a_whole_block_in_place_leaves_the_fake_final_obs_alone(
    blocks_backend: list,
) -> None:
    """The sub-envs move in step, so each round is one block, and a policy's obs column is
    that block's own array; the fake final obs must still be the last obs the env gave."""
    case = CASES["last_obs_gone_connector_in_place"]
    sync, _ = _batches(case, "sync", 100)
    blocks, _ = _batches(case, "whole_blocks_test", 100)
    assert blocks_backend[0].blocks_given > 10
    for column in ("obs", "new_obs", "rewards"):
        np.testing.assert_array_equal(sync["shared"][column], blocks["shared"][column])


def test_block_rewards_conserved_per_agent(blocks_backend: list) -> None:
    tracker = EpisodeTracker()
    cfg = config(**{**CASES["cheap_two_policies"], "env_name": logged_env_name(CHEAP)},
                 vectorize="blocks_test")
    with EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_env_steps=200)
        assert_rewards_conserved(batch, runner, tracker, min_episodes=5)
    assert blocks_backend[0].rows_given > 100


def test_poll_blocks_defaults_to_poll_and_materialize_gives_the_dicts() -> None:
    from marl_runner.envs import make_vector_env

    cfg = config(CHEAP, num_envs=3, seed=0, env_config={"num_agents": 2, "episode_len": 4})
    env = make_vector_env(cfg)
    try:
        polled = env.poll_blocks()
        assert all(type(obs) is dict for obs in polled[0].values())
        assert materialize(polled) is polled
        blocking = BlockingVectorEnv(env)
        env.send_actions({e: {a: 0 for a in obs} for e, obs in polled[0].items()})
        # What the blocking env hands out as blocks, materialized, is what poll gave.
        given = blocking.poll_blocks()
        assert any(type(obs) is BlockRow for obs in given[0].values())
        made = materialize(given)
        assert list(made[0]) == list(given[0])
        for env_id, row in given[0].items():
            if type(row) is not BlockRow:
                assert made[0][env_id] is row
                continue
            obs, rewards = made[0][env_id], made[1][env_id]
            np.testing.assert_array_equal(np.stack(list(obs.values())), row.block.obs[row.index])
            assert all(type(value) is float for value in rewards.values())
            assert made[5][env_id] == {}
    finally:
        env.stop()


def test_step_block_refuses_arrays_that_do_not_match_its_sub_envs_and_agents() -> None:
    with pytest.raises(ValueError, match=r"2 sub-envs x 3 agents.*expected both to start with"):
        StepBlock([0, 1], ("a", "b", "c"), np.zeros((2, 2, 4)), np.zeros((2, 3)), {}, {}, {})


@pytest.mark.parametrize(
    "flags_and_infos",
    [({"a": True}, {}, {}), ({}, {"__all__": True}, {}), ({}, {}, {"a": {"x": 1}})],
    ids=["terminated", "truncated", "info"],
)
def test_step_block_refuses_a_flag_or_an_info(flags_and_infos: tuple) -> None:
    """The runner trusts that a block's sub-envs go on and give no info."""
    with pytest.raises(ValueError, match=r"expected no flag set and no info"):
        StepBlock([0], ("a",), np.zeros((1, 1, 2)), np.zeros((1, 1)), *flags_and_infos)


def test_step_block_takes_agent_ids_as_a_tuple_and_rewards_as_float64() -> None:
    block = StepBlock([3], ["a", "b"], np.zeros((1, 2, 2)), np.ones((1, 2), np.float32), {}, {}, {})
    assert block.agent_ids == ("a", "b") and block.rewards.dtype == np.float64
    assert block.output(0)[1] == {"a": 1.0, "b": 1.0}


def test_joined_rows_keeps_row_order_and_stacks_what_stacks() -> None:
    block = np.arange(12, dtype=np.float32).reshape(3, 4)
    loose = [np.full(4, -1.0, np.float32), np.full(4, -2.0, np.float32)]
    stacked = [(1, block, np.array([10.0, 11.0, 12.0]))]
    obs, rewards = joined_rows(stacked, loose, [1.0, 2.0])
    assert isinstance(obs, np.ndarray) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs, np.stack([loose[0], *block, loose[1]]))
    np.testing.assert_array_equal(rewards, [1.0, 10.0, 11.0, 12.0, 2.0])
    # A loose obs that does not stack like the block's rows: a list of all rows, in order,
    # for the connectors to stack or reject as they would without blocks.
    odd = [np.zeros(5, np.float32), np.full(4, -2.0, np.float32)]
    obs, _ = joined_rows(stacked, odd, [1.0, 2.0])
    assert isinstance(obs, list) and len(obs) == 5
    assert obs[0].shape == (5,)
    np.testing.assert_array_equal(np.stack(obs[1:4]), block)
    # One block and nothing else: its own arrays.
    alone = [(0, block, stacked[0][2])]
    only_obs, only_rewards = joined_rows(alone, [], [])
    assert only_obs is block and only_rewards is alone[0][2]


def test_the_runner_polls_blocks_only_where_that_cannot_bypass_a_changed_poll() -> None:
    class ChangesPoll(BlockingVectorEnv):
        def poll(self) -> PollDicts:
            return self.inner.poll()

    class Forwarding:  # duck-typed: its own poll, the rest (poll_blocks too) forwarded
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def poll(self) -> PollDicts:
            return self.inner.poll()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    blocking = BlockingVectorEnv.__new__(BlockingVectorEnv)
    assert poll_method(blocking) == blocking.poll_blocks
    changed = ChangesPoll.__new__(ChangesPoll)
    assert poll_method(changed) == changed.poll
    forwarding = Forwarding(blocking)
    assert poll_method(forwarding) == forwarding.poll
