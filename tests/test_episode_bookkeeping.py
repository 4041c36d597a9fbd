"""Per-episode bookkeeping made once per episode: ids, reward totals, the metrics record."""

from __future__ import annotations

import types

from marl_runner.metrics import RolloutMetrics
from marl_runner.sampling import episode_ids
from marl_runner.sampling.episode import AgentSlot, EpisodeLayout, MultiAgentEpisode
from marl_runner.sampling.episode_ids import EpisodeIds
from marl_runner.sampling.rewards import RewardLedger


def _episode(live: dict | None = None) -> MultiAgentEpisode:
    return MultiAgentEpisode(7, 2, lambda agent_id, episode: f"pol_{agent_id}", lambda e: dict(live or {}))


def _observe(episode: MultiAgentEpisode, *agent_ids: str) -> None:
    for agent_id in agent_ids:
        slot = AgentSlot(agent_id, episode.policy_for(agent_id), len(episode.slots), len(episode.slots))
        episode.slots[agent_id] = slot


def test_episode_ids_count_up_from_a_random_base_and_wrap_after_the_span(monkeypatch) -> None:
    monkeypatch.setattr(episode_ids.secrets, "randbelow", lambda n: 41)
    monkeypatch.setattr(episode_ids, "_SPAN", 3)
    ids = EpisodeIds()
    assert [ids.next() for _ in range(7)] == [42, 43, 44, 42, 43, 44, 42]
    assert EpisodeIds().next() == 42  # each instance counts on its own


def test_agent_rewards_order_counted_then_live_then_unrewarded_observers() -> None:
    episode = _episode(live={"b": 0.5, "c": 2.0})
    _observe(episode, "b", "c", "d")
    episode.rewards.receive({"ghost": 1.0, "b": 1.0})  # ghost never observed: mapped anyway
    assert list(episode.agent_rewards.items()) == [
        (("ghost", "pol_ghost"), 1.0), (("b", "pol_b"), 1.5), (("c", "pol_c"), 2.0), (("d", "pol_d"), 0.0),
    ]
    assert episode.total_reward == 4.5


def test_agent_rewards_of_an_episode_nobody_was_rewarded_in() -> None:
    episode = _episode()
    assert episode.agent_rewards == {}
    _observe(episode, "a")
    assert episode.agent_rewards == {("a", "pol_a"): 0.0}


def test_the_metrics_record_names_each_field_and_owns_its_dicts() -> None:
    episode = _episode(live={"a": 3.0})
    _observe(episode, "a")
    episode.length = 5
    episode.custom_metrics["score"] = 1.0
    episode.hist_data["h"] = [1]
    perf = {"mean_inference_ms": 0.5}
    record = RolloutMetrics.of_episode(episode, perf)
    assert record == RolloutMetrics(
        episode_length=5, episode_reward=3.0, agent_rewards={("a", "pol_a"): 3.0},
        custom_metrics={"score": 1.0}, perf_stats=perf, hist_data={"h": [1]}, media={},
        connector_metrics={}, episode_faulty=False,
    )
    episode.custom_metrics["later"] = 2.0
    assert record.custom_metrics == {"score": 1.0}
    episode.faulty = True
    faulty = RolloutMetrics.of_episode(episode)
    assert faulty.agent_rewards == {} and faulty.episode_reward == 0.0 and faulty.episode_faulty
    assert faulty.perf_stats == {}


def test_settle_of_a_round_without_rewards_puts_zero_on_every_row_unless_something_is_held() -> None:
    ledger = RewardLedger()
    slots = {"a": types.SimpleNamespace(done=False)}
    assert ledger.settle({}, [("a", True), ("b", True)], slots, ["c"]) == [0.0, 0.0]
    ledger.settle({"a": 2.0}, [], slots, [])  # a has no row: held
    assert ledger.settle({}, [("a", False)], slots, []) == [2.0]
    assert ledger.held == {}


def test_a_layout_groups_agent_ids_and_keys_per_policy() -> None:
    layout = EpisodeLayout({"p": (["a", "b"], [3, 4]), "q": (["c"], [5])})
    assert [(pid, ids) for pid, ids, _ in layout.shape.groups] == [("p", ("a", "b")), ("q", ("c",))]
    assert layout.group_keys == ((3, 4), (5,))
    assert layout.shape is EpisodeLayout({"p": (("a", "b"), (9, 8)), "q": (("c",), (7,))}).shape
