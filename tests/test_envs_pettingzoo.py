"""ParallelPettingZooEnv / AECPettingZooEnv on real PettingZoo envs and toy ones."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from mpe2 import simple_spread_v3
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.classic import connect_four_v3, tictactoe_v3
from pettingzoo.test.example_envs import (
    generated_agents_env_action_mask_info_v0,
    generated_agents_env_action_mask_obs_v0,
    generated_agents_parallel_v0,
)
from pettingzoo.utils.wrappers import BaseWrapper

from marl_runner.envs import AECPettingZooEnv, EnvError, ParallelPettingZooEnv
from tests.envs import play_episode

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class RewardSpy(BaseWrapper):
    """Sums `env.rewards` after every `env.step` call: what the env handed out."""

    def __init__(self, env: AECEnv) -> None:
        super().__init__(env)
        self.given: dict[str, float] = {}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.given = {}
        self._add(self.env.rewards)

    def step(self, action):
        super().step(action)
        self._add(self.env.rewards)

    def _add(self, rewards):
        for agent, reward in rewards.items():
            self.given[agent] = self.given.get(agent, 0.0) + reward


def generated_aec(module, max_cycles: int) -> AECEnv:
    """A generated-agents fixture env (fully wrapped) with a shorter episode."""
    env = module.env()
    env.unwrapped.max_cycles = max_cycles
    return env


AEC_GAMES = {
    "tictactoe": lambda: tictactoe_v3.env(),
    "connect_four": lambda: connect_four_v3.env(),
    "generated_mask_info": lambda: generated_aec(generated_agents_env_action_mask_info_v0, 15),
    "generated_mask_obs": lambda: generated_aec(generated_agents_env_action_mask_obs_v0, 15),
}


@pytest.mark.parametrize("game", sorted(AEC_GAMES))
def test_aec_rewards_sum_to_what_the_env_gave(game):
    for seed in range(8):
        spy = RewardSpy(AEC_GAMES[game]())
        record = play_episode(AECPettingZooEnv(spy), seed=seed, rng_seed=seed)
        given = {agent: reward for agent, reward in spy.given.items() if reward}
        returned = {agent: reward for agent, reward in record.rewards.items() if reward}
        assert returned == pytest.approx(given), f"seed {seed}"


def test_aec_step_rewards_not_cumulative_and_rewards_of_others_reported():
    env = AECPettingZooEnv(ToyAEC())
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["a"]
    totals: dict[str, float] = {}
    rounds = []
    while True:
        (agent,) = [a for a in obs if not env.env.terminations.get(a, True)] or [None]
        result = env.step({agent: 0})
        obs, rewards, terminateds, truncateds, _ = result
        rounds.append(result)
        for a, r in rewards.items():
            totals[a] = totals.get(a, 0.0) + r
        if terminateds["__all__"] or truncateds["__all__"]:
            break
    # every step gives every agent +1; `a` also got 0.5 at reset
    assert totals == pytest.approx(ToyAEC.expected_totals())
    # the first step carries the reset reward and the step reward of `b`, who has no obs yet
    assert rounds[0][1] == {"a": 1.5, "b": 1.0, "c": 1.0}
    assert list(rounds[0][0]) == ["b"]


def test_aec_dead_agents_are_stepped_out_with_their_own_flags():
    env = AECPettingZooEnv(ToyAEC())
    obs, _ = env.reset(seed=0)
    seen = []
    while True:
        (agent,) = [a for a in obs if not env.env.terminations.get(a, True)]
        obs, rewards, terminateds, truncateds, infos = env.step({agent: 0})
        seen.append((list(obs), dict(terminateds), dict(truncateds)))
        assert set(infos) == set(obs)
        if terminateds["__all__"] or truncateds["__all__"]:
            break
    # c terminates on step 1 but is selected only when its turn comes: then it
    # gets its final obs (terminated) before a's live obs, in one return
    assert ["c", "a"] in [names for names, _, _ in seen]
    flushed = next(s for s in seen if s[0] == ["c", "a"])
    assert flushed[1] == {"c": True, "a": False, "__all__": False}
    # the last round: a and b truncated by the time limit
    last_obs, last_terminateds, last_truncateds = seen[-1]
    assert sorted(last_obs) == ["a", "b"]
    assert last_truncateds == {"a": True, "b": True, "__all__": True}
    assert last_terminateds["__all__"] is False


def test_aec_game_end_flushes_both_players_terminated():
    env = AECPettingZooEnv(tictactoe_v3.env())
    for seed in range(5):
        record = play_episode(env, seed=seed, rng_seed=seed)
        obs, rewards, terminateds, truncateds, _ = record.steps[-1]
        assert sorted(obs) == ["player_1", "player_2"]
        assert terminateds == {"player_1": True, "player_2": True, "__all__": True}
        assert truncateds["__all__"] is False
        assert sum(record.rewards.values()) == 0
        for step_obs, *_ in record.steps[:-1]:
            assert len(step_obs) == 1  # only the player to move observes


def test_aec_reset_returns_only_the_first_mover_and_obs_keep_masks():
    env = AECPettingZooEnv(connect_four_v3.env())
    obs, infos = env.reset(seed=0)
    assert list(obs) == ["player_0"] and list(infos) == ["player_0"]
    assert obs["player_0"]["action_mask"].shape == (7,)


def test_aec_action_mask_in_infos_survives_and_time_limit_truncates():
    env = AECPettingZooEnv(generated_aec(generated_agents_env_action_mask_info_v0, 10))
    record = play_episode(env, seed=1)
    for obs, _, terminateds, truncateds, infos in record.steps:
        for agent in obs:
            if not (terminateds.get(agent) or truncateds.get(agent)):
                mask = infos[agent]["action_mask"]
                assert mask.dtype == np.int8 and mask.sum() == 1
    # masks were obeyed, so no illegal-move termination: the time limit ended it
    assert record.steps[-1][3]["__all__"] is True
    assert record.steps[-1][2]["__all__"] is False


def test_aec_spawned_agents_have_spaces():
    env = AECPettingZooEnv(generated_aec(generated_agents_env_action_mask_info_v0, 15))
    record = play_episode(env, seed=2)
    agents = {agent for obs, *_ in record.steps for agent in obs}
    assert len(agents) > 5  # agents spawned during the episode
    assert env.possible_agents == []
    obs, *_ = record.steps[-1]
    for agent, agent_obs in obs.items():
        assert env.get_observation_space(agent).contains(agent_obs)
        assert isinstance(env.get_action_space(agent), gym.spaces.Discrete)


def test_aec_step_rejects_wrong_actions_and_ignores_empty_ones_after_the_end():
    env = AECPettingZooEnv(tictactoe_v3.env())
    env.reset(seed=0)
    with pytest.raises(
        EnvError, match="waits for agent 'player_1'.*got actions for \\['player_2'\\]"
    ):
        env.step({"player_2": 0})
    with pytest.raises(EnvError, match="waits for agent 'player_1'"):
        env.step({})
    play_episode(env, seed=0)
    assert env.step({}) == ({}, {}, {"__all__": False}, {"__all__": False}, {})
    with pytest.raises(EnvError, match="no agents left"):
        env.step({"player_1": 0})


def test_aec_seeding_gives_identical_obs_sequences():
    def obs_sequence(seed):
        env = AECPettingZooEnv(generated_aec(generated_agents_env_action_mask_info_v0, 5))
        return [step[0] for step in play_episode(env, seed=seed).steps]

    first, again, other = obs_sequence(3), obs_sequence(3), obs_sequence(4)
    assert_same_obs(first, again)
    with pytest.raises(AssertionError):
        assert_same_obs(first, other)


def test_parallel_passes_data_through_and_adds_all_to_copies():
    inner = ToyParallel()
    env = ParallelPettingZooEnv(inner)
    env.reset(seed=0)
    obs, rewards, terminateds, truncateds, infos = env.step({"x": 0, "y": 0})
    assert obs is inner.last[0] and rewards is inner.last[1] and infos is inner.last[4]
    assert "__all__" not in inner.last[2] and "__all__" not in inner.last[3]
    assert terminateds == {"x": False, "y": True, "__all__": False}
    obs, rewards, terminateds, truncateds, infos = env.step({"x": 0})
    assert terminateds == {"x": False, "__all__": False}
    assert truncateds == {"x": True, "__all__": True}
    assert env.step({}) == ({}, {}, {"__all__": False}, {"__all__": False}, {})


def test_parallel_kaz_vector_obs_ends_with_all_flag():
    env = ParallelPettingZooEnv(
        knights_archers_zombies_v11.parallel_env(obs_method="vector", max_cycles=60)
    )
    assert env.possible_agents == ["archer_0", "archer_1", "knight_0", "knight_1"]
    record = play_episode(env, seed=0)
    _, _, terminateds, truncateds, _ = record.steps[-1]
    assert terminateds["__all__"] != truncateds["__all__"]
    for step_obs, *_ in record.steps:
        for agent, agent_obs in step_obs.items():
            assert env.get_observation_space(agent).shape == agent_obs.shape


def test_parallel_mpe_time_limit_is_truncation_and_seeding_is_reproducible():
    def run(seed):
        return play_episode(
            ParallelPettingZooEnv(simple_spread_v3.parallel_env(max_cycles=10)), seed=seed
        )

    record = run(5)
    assert record.length == 10
    assert record.steps[-1][3]["__all__"] is True
    assert record.steps[-1][2]["__all__"] is False
    assert all(not step[3]["__all__"] for step in record.steps[1:-1])
    assert_same_obs([s[0] for s in record.steps], [s[0] for s in run(5).steps])


def test_parallel_generated_agents_spawn_and_die():
    env = ParallelPettingZooEnv(generated_agents_parallel_v0.parallel_env())
    obs, _ = env.reset(seed=0)
    seen, ended = set(obs), set()
    for _ in range(150):
        actions = {agent: env.get_action_space(agent).sample() for agent in env.env.agents}
        obs, rewards, terminateds, truncateds, _ = env.step(actions)
        assert terminateds["__all__"] is False and truncateds["__all__"] is False
        assert not ended & set(obs)
        ended |= {a for a in obs if terminateds[a] or truncateds[a]}
        seen |= set(obs)
        for agent, agent_obs in obs.items():
            assert env.get_observation_space(agent).contains(agent_obs)
    assert len(seen) > 5 and ended


def assert_same_obs(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert list(a) == list(b)
        for agent in a:
            np.testing.assert_array_equal(np.asarray(a[agent]), np.asarray(b[agent]))


class ToyAEC(AECEnv):
    """Three agents a, b, c moving in turn; every step rewards every agent +1.

    `a` is rewarded 0.5 at reset; `c` is marked terminated on step 1 while
    it is not selected, so it is stepped out only when its turn comes (and
    is rewarded on step 2 while dead); a and b are truncated on step 7.
    """

    metadata = {"name": "toy_aec"}
    possible_agents = ["a", "b", "c"]

    @staticmethod
    def expected_totals():
        env = ToyAEC()
        env.reset()
        given = {"a": 0.5}
        while env.agents:
            dead = env.terminations[env.agent_selection] or env.truncations[env.agent_selection]
            env.step(None if dead else 0)
            for agent, reward in env.rewards.items():
                given[agent] = given.get(agent, 0.0) + reward
        return given

    def observation_space(self, agent):
        return gym.spaces.Discrete(10)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = {"a": 0.5, "b": 0.0, "c": 0.0}
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {"turn": 0} for agent in self.agents}
        self.agent_selection = "a"
        self.num_steps = 0

    def observe(self, agent):
        return self.num_steps

    def step(self, action):
        agent = self.agent_selection
        order = self.agents
        index = order.index(agent)
        if self.terminations[agent] or self.truncations[agent]:
            assert action is None
            order.remove(agent)
            for table in (self.terminations, self.truncations, self.rewards, self.infos):
                del table[agent]
            self.rewards = dict.fromkeys(order, 0.0)
        else:
            self.num_steps += 1
            self.rewards = dict.fromkeys(order, 1.0)
            if self.num_steps == 1:
                self.terminations["c"] = True
            if self.num_steps == 7:
                self.truncations = dict.fromkeys(order, True)
            index += 1
        if order:
            dead = [a for a in order if self.truncations[a]]
            self.agent_selection = dead[0] if dead else order[index % len(order)]


class ToyParallel(ParallelEnv):
    """x and y; y terminates on step 1, x is truncated on step 2. Keeps what it returned."""

    metadata = {"name": "toy_parallel"}
    possible_agents = ["x", "y"]

    def observation_space(self, agent):
        return gym.spaces.Discrete(3)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: 0 for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        obs = {a: self.t for a in self.agents}
        rewards = dict.fromkeys(self.agents, 1.0)
        terminateds = {a: self.t == 1 and a == "y" for a in self.agents}
        truncateds = {a: self.t == 2 for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminateds[a] or truncateds[a])]
        self.last = (obs, rewards, terminateds, truncateds, infos)
        return self.last


class OldGymStep(ToyParallel):
    """Steps the way gym did before terminations and truncations were split."""

    def step(self, actions):
        obs, rewards, terminateds, _, infos = super().step(actions)
        return obs, rewards, terminateds, infos


class ObsOnlyReset(ToyParallel):
    def reset(self, seed=None, options=None):
        return super().reset(seed=seed)[0]


class FlagAs(ToyParallel):
    """y's termination on step 1 given as `flag` instead of True."""

    def __init__(self, flag):
        self.flag = flag

    def step(self, actions):
        obs, rewards, terminateds, truncateds, infos = super().step(actions)
        terminateds = {a: self.flag if done else False for a, done in terminateds.items()}
        return obs, rewards, terminateds, truncateds, infos


def test_parallel_step_and_reset_of_another_shape_are_named_errors():
    """A 4-tuple step was a bare 'not enough values to unpack'; an obs-only reset unpacked
    the obs dict's keys and was called 'a tuple of 2 (str, str)'."""
    env = ParallelPettingZooEnv(OldGymStep())
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"OldGymStep.step returned a tuple of 4; .*returns 5 "):
        env.step({"x": 0, "y": 0})
    with pytest.raises(EnvError, match=r"dict with keys \['x', 'y'\] \(the obs alone\?\); .*"
                       r"reset returns \(obs, infos\)"):  # fmt: skip
        ParallelPettingZooEnv(ObsOnlyReset()).reset(seed=0)


@pytest.mark.parametrize("flag", ["no", 2, 0.5, [1]])
def test_parallel_a_set_flag_that_is_no_bool_is_a_named_error(flag):
    """A terminated flag of "no" counted as True: the agent's episode ended silently."""
    env = ParallelPettingZooEnv(FlagAs(flag))
    env.reset(seed=0)
    with pytest.raises(
        EnvError, match=rf"FlagAs gave terminations\['y'\] = {re.escape(repr(flag))}"
    ):
        env.step({"x": 0, "y": 0})


def test_parallel_flags_that_are_no_dict_are_a_named_error():
    class ListFlags(ToyParallel):
        def step(self, actions):
            obs, rewards, terminateds, truncateds, infos = super().step(actions)
            return obs, rewards, terminateds, list(truncateds.values()), infos

    env = ParallelPettingZooEnv(ListFlags())
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"ListFlags.step returned truncations as a list of 2; "):
        env.step({"x": 0, "y": 0})


@pytest.mark.parametrize("flag", [True, np.True_, 1, np.int8(1)])
def test_parallel_bool_like_flags_end_the_agent(flag):
    env = ParallelPettingZooEnv(FlagAs(flag))
    env.reset(seed=0)
    _, _, terminateds, _, _ = env.step({"x": 0, "y": 0})
    assert terminateds["y"] is flag and terminateds["__all__"] is False
    assert env.step({"x": 0})[3] == {"x": True, "__all__": True}


class SelectsUnlisted(ToyAEC):
    """After the first move, `b` (listed in env.agents) loses its termination entry, or the
    env selects `ghost`, an agent it never had."""

    def __init__(self, who):
        self.who = who

    def step(self, action):
        super().step(action)
        if self.who == "b":
            del self.terminations["b"]
        else:
            self.agent_selection = self.who


@pytest.mark.parametrize(
    ("who", "words"),
    [
        ("b", "'b' (in env.agents), which env.terminations lacks;"),
        ("ghost", "'ghost' (not in env.agents), which env.terminations and env.truncations and "
         "env.infos lack;"),
    ],
)  # fmt: skip
def test_aec_a_selection_without_flags_is_a_named_error(who, words):
    """An agent_selection missing from env.terminations was a bare KeyError."""
    env = AECPettingZooEnv(SelectsUnlisted(who))
    env.reset(seed=0)
    with pytest.raises(EnvError, match=f"selected agent {re.escape(words)}"):
        env.step({"a": 0})


def test_aec_a_set_flag_that_is_no_bool_is_a_named_error():
    class StringFlag(ToyAEC):
        def step(self, action):
            super().step(action)
            if "c" in self.terminations and self.terminations["c"] is True:
                self.terminations["c"] = "yes"

    env = AECPettingZooEnv(StringFlag())
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"StringFlag gave terminations\['c'\] = 'yes' \(str\)"):
        for agent in ("a", "b"):
            env.step({agent: 0})
