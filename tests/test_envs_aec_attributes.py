"""AEC per-step attributes are read past PettingZoo's forwarding wrappers, never past a user's."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3, tictactoe_v3
from pettingzoo.utils.wrappers import BaseWrapper, OrderEnforcingWrapper

from marl_runner.envs import AECPettingZooEnv, aec_attributes
from marl_runner.envs.aec_attributes import AECState, attribute_owner

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

NAMES = ("agents", "agent_selection", "terminations", "truncations", "rewards", "infos")


class DoubledRewards(BaseWrapper):
    """A user's reward shaping: ``rewards`` defined by the wrapper itself."""

    @property
    def rewards(self):
        return {agent: 2 * reward for agent, reward in self.env.rewards.items()}


class Passthrough(BaseWrapper):
    """A user's wrapper that defines nothing: still never looked past."""


def test_petting_zoo_s_own_wrappers_are_looked_past() -> None:
    env = connect_four_v3.env()
    assert type(env) is not type(env.unwrapped)  # wrapped three times
    for name in NAMES:
        assert attribute_owner(env, name) is env.unwrapped


def test_a_user_wrapper_is_where_the_reads_stop() -> None:
    inner = Passthrough(tictactoe_v3.raw_env())
    env = OrderEnforcingWrapper(inner)
    for name in NAMES:
        assert attribute_owner(env, name) is inner
    assert attribute_owner(DoubledRewards(env), "rewards").__class__ is DoubledRewards


@pytest.mark.parametrize("make", [connect_four_v3.env, tictactoe_v3.env])
def test_every_read_gives_what_the_wrapper_chain_gives(make) -> None:
    """Same objects as reading through all wrappers, at every step of games that end
    normally and by an illegal move (which replaces the dicts on the unwrapped env)."""
    rng = np.random.default_rng(0)
    for always_first in (False, True):  # True: action 0 until it is illegal, then once more
        env = make()
        live = AECState(env)
        env.reset(seed=1)
        while env.agents:
            for name in NAMES:
                assert getattr(live, name) is getattr(env, name), name
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                env.step(None)
                continue
            legal = np.flatnonzero(env.observe(agent)["action_mask"])
            env.step(0 if always_first else int(rng.choice(legal)))
        for name in NAMES:
            assert getattr(live, name) is getattr(env, name), name


def test_a_user_s_reward_shaping_reaches_the_adapter() -> None:
    plain = AECPettingZooEnv(connect_four_v3.env())
    shaped = AECPettingZooEnv(DoubledRewards(connect_four_v3.env()))
    totals = []
    for adapter in (plain, shaped):
        obs, _ = adapter.reset(seed=3)
        total = 0.0
        for _ in range(60):
            (agent, agent_obs), = obs.items()
            action = int(np.flatnonzero(agent_obs["action_mask"])[0])
            obs, rewards, terminateds, _, _ = adapter.step({agent: action})
            total += sum(abs(r) for r in rewards.values())
            if terminateds["__all__"]:
                break
        totals.append(total)
    assert totals[0] > 0
    assert totals[1] == 2 * totals[0]


def test_before_pettingzoo_1_25_nothing_is_looked_past(monkeypatch) -> None:
    """PettingZoo 1.24's illegal-move wrapper set flags and rewards on itself."""
    monkeypatch.setattr(aec_attributes, "_WRAPPERS_ONLY_FORWARD", False)
    env = connect_four_v3.env()
    for name in NAMES:
        assert attribute_owner(env, name) is env


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("1.27.0", (1, 27, 0)), ("1.25.0rc1", (1, 25, 0)), ("1.24.3", (1, 24, 3)), ("1.26", (1, 26))],
)
def test_versions_compare_by_their_leading_numbers(text, parsed) -> None:
    assert aec_attributes._version(text) == parsed
    assert (parsed >= aec_attributes._FORWARDING_SINCE) == (parsed[:2] >= (1, 25))
