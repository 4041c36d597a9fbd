"""The shipped testing envs do what their docstrings promise."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test.example_envs import (
    generated_agents_env_action_mask_info_v0,
    generated_agents_env_action_mask_obs_v0,
)

from marl_runner.envs import AECPettingZooEnv
from tests.envs import (
    BoxActionEnv,
    CheapEnv,
    CrashingEnv,
    CrashingEnvError,
    DictObsEnv,
    DyingAgentsEnv,
    MaskInfoEnv,
    MultiDiscreteEnv,
    NoObsEnv,
    PadSpacesWrapper,
    SpawningAgentsEnv,
    TimeLimitEnv,
    TurnBasedEnv,
    play_episode,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

ALL_ENVS = [
    CheapEnv,
    DyingAgentsEnv,
    SpawningAgentsEnv,
    TurnBasedEnv,
    TimeLimitEnv,
    NoObsEnv,
    lambda: CrashingEnv(crash_step=None),
    DictObsEnv,
    MaskInfoEnv,
    BoxActionEnv,
    MultiDiscreteEnv,
]


@pytest.mark.parametrize("make", ALL_ENVS)
def test_reward_log_matches_what_was_handed_out_and_seeds_repeat(make):
    env = make()
    first = play_episode(env, seed=7)
    second = play_episode(env)
    assert env.reward_log[0] == pytest.approx(first.rewards)
    assert env.reward_log[1] == pytest.approx(second.rewards)
    assert len(env.reward_log) == 2
    again = play_episode(make(), seed=7)
    for a, b in zip(first.steps, again.steps):
        assert list(a[0]) == list(b[0])
        for agent in a[0]:
            np.testing.assert_equal(a[0][agent], b[0][agent])
    for step_obs, *_ in first.steps:
        for agent, agent_obs in step_obs.items():
            assert env.get_observation_space(agent).contains(agent_obs)


def test_cheap_env_obs_change_every_step_and_time_limit_truncates():
    env = CheapEnv(num_agents=3, episode_len=4)
    record = play_episode(env, seed=0)
    assert record.length == 4
    rows = [np.stack(list(step[0].values())) for step in record.steps]
    for t, row in enumerate(rows):
        np.testing.assert_allclose(row[:, 0], t / 4)
        np.testing.assert_allclose(row[:, 1], np.arange(3) / 3)
    assert not any(o.flags.writeable for step in record.steps for o in step[0].values())
    _, _, terminateds, truncateds, _ = record.steps[-1]
    assert truncateds == {"agent_0": True, "agent_1": True, "agent_2": True, "__all__": True}
    assert not any(terminateds.values())
    with pytest.raises(RuntimeError, match="after its 4-round episode"):
        env.step({})
    kept = record.steps[1][0]["agent_0"]
    kept_copy = kept.copy()
    env.reset()
    env.step({})
    np.testing.assert_array_equal(kept, kept_copy)  # a new episode never overwrites old obs


def test_dying_agents_end_at_their_rounds_and_a3_ends_without_obs():
    record = play_episode(DyingAgentsEnv())
    final_obs = {
        agent: round_index
        for round_index, (obs, _, terminateds, _, _) in enumerate(record.steps)
        for agent in obs
        if terminateds.get(agent)
    }
    assert final_obs == {"a0": 3, "a1": 6, "a2": 9}
    obs, rewards, terminateds, _, _ = record.steps[-1]
    assert "a3" not in obs and "a3" in rewards and terminateds["__all__"]


def test_spawning_agents_appear_late_one_already_done():
    record = play_episode(SpawningAgentsEnv())
    first_seen = {}
    for round_index, (obs, *_) in enumerate(record.steps):
        for agent in obs:
            first_seen.setdefault(agent, round_index)
    assert first_seen == {"a0": 0, "a1": 2, "a2": 3, "a3": 5}
    assert record.steps[3][2]["a2"] is True
    assert record.steps[1][1]["a1"] == 0.5  # rewarded before its first obs
    assert record.steps[-1][3]["__all__"] and not record.steps[-1][2]["__all__"]


def test_turn_based_rewards_reach_players_without_obs():
    record = play_episode(TurnBasedEnv())
    off_turn = [
        (round_index, agent)
        for round_index, (obs, rewards, *_) in enumerate(record.steps)
        for agent in rewards
        if agent not in obs
    ]
    assert (1, "p2") in off_turn and (5, "p1") in off_turn and (2, "p0") in off_turn
    assert all(len(obs) == 1 for obs, *_ in record.steps if "p1" not in obs or len(obs) == 1)


def test_time_limit_env_truncates_with_a1_unobserved():
    obs, _, terminateds, truncateds, _ = play_episode(TimeLimitEnv()).steps[-1]
    assert list(obs) == ["a0"] and truncateds == {"a0": True, "__all__": True}
    assert terminateds["__all__"] is False


def test_no_obs_env_never_observes():
    record = play_episode(NoObsEnv())
    assert all(not obs for obs, *_ in record.steps) and record.length == 2


def test_scripted_envs_reject_wrong_actors_and_bad_actions():
    env = DyingAgentsEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected actions for \['a0', 'a1', 'a2', 'a3'\]"):
        env.step({"a0": 0})
    env = MaskInfoEnv(num_actions=4)
    _, infos = env.reset(seed=0)
    forbidden = {a: int(np.flatnonzero(info["action_mask"] == 0)[0]) for a, info in infos.items()}
    with pytest.raises(ValueError, match="forbids"):
        env.step(forbidden)
    env = DictObsEnv()
    obs, _ = env.reset(seed=0)
    assert set(obs["a0"]) == {"observation", "action_mask"}
    env = BoxActionEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in Box"):
        env.step({"a0": np.array([0.0, 1.5]), "a1": np.zeros(2)})
    env.reset(seed=0)
    env.step({"a0": np.zeros(2, np.float64), "a1": np.zeros(2, np.float32)})
    env = MultiDiscreteEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in MultiDiscrete"):
        env.step({"a0": np.array([2, 4]), "a1": np.array([0, 0])})
    with pytest.raises(ValueError, match="not in MultiDiscrete"):
        env.step({"a0": np.array([0.0, 1.0]), "a1": np.array([0, 0])})


def test_crashing_env_crashes_on_cue():
    env = CrashingEnv(crash_step=2, step_crashes=1, reset_crashes=1)
    with pytest.raises(CrashingEnvError, match="reset #1"):
        env.reset()
    env.reset(seed=0)
    env.step({"a0": 0, "a1": 0})
    with pytest.raises(CrashingEnvError, match="step 2"):
        env.step({"a0": 0, "a1": 0})
    env.step({"a0": 0, "a1": 0})  # the crash left the episode as it was; one crash only
    env.reset()
    env.step({"a0": 0, "a1": 0})
    env.step({"a0": 0, "a1": 0})


@pytest.mark.parametrize(
    "module", [generated_agents_env_action_mask_info_v0, generated_agents_env_action_mask_obs_v0]
)
def test_pad_spaces_wrapper_gives_one_space_for_all_generated_agents(module):
    inner = module.env()
    inner.unwrapped.max_cycles = 8
    env = PadSpacesWrapper(AECPettingZooEnv(inner))
    for seed in range(3):
        record = play_episode(env, seed=seed, rng_seed=seed)
        assert env.reward_log[-1] == pytest.approx(record.rewards)
        for obs, _, _, _, infos in record.steps:
            for agent, agent_obs in obs.items():
                assert env.get_observation_space(agent).contains(agent_obs)
                mask = (
                    agent_obs["action_mask"]
                    if isinstance(agent_obs, dict)
                    else infos[agent]["action_mask"]
                )
                real_actions = inner.action_space(agent).n
                assert mask.shape == (10,) and not mask[real_actions:].any()
    agent = next(iter(env.reset(seed=0)[0]))
    with pytest.raises(ValueError, match="padding action 9"):
        env.step({agent: 9})
