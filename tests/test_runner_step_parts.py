"""The loop's named parts: poll data, the reward ledger's decisions, step timings."""

from __future__ import annotations

import types

import numpy as np
import pytest

from marl_runner.metrics import PHASES, STEP_PHASES, PerfStats
from marl_runner.sampling.columns import ColumnBuffer
from marl_runner.sampling.env_output import PollResult, SubEnvOutput
from marl_runner.sampling.episode import LayoutShape
from marl_runner.sampling.rewards import RewardLedger, add_rewards_after_done


def _slots(**done: bool) -> dict:
    return {agent: types.SimpleNamespace(done=flag) for agent, flag in done.items()}


def test_poll_result_names_the_six_dicts_and_a_sub_env_reads_missing_ones_as_empty() -> None:
    polled = PollResult._make(({0: {"a": 1}}, {}, {0: {"__all__": True}}, {}, {}, {0: {}, 1: {"a": 2}}))
    output = polled.of(0)
    assert output.obs == {"a": 1} and output.rewards == {} and output.infos == {}
    assert output.all_terminated and not output.all_truncated and output.episode_over
    assert polled.off_policy() == {1: {"a": 2}}
    reset = SubEnvOutput.of_reset({"a": 3}, {"a": {"x": 1}})
    assert not reset.episode_over and reset.rewards == {} and reset.infos == {"a": {"x": 1}}


def test_the_fast_path_needs_nothing_held_and_every_reward_on_an_observing_agent() -> None:
    ledger = RewardLedger()
    observing = frozenset({"a", "b"})
    assert ledger.fast_path_ok({"a": 1.0}, observing)
    both = LayoutShape((("p", ("a", "b")),)).groups[0][2]
    assert ledger.rewards_on_rows([{"a": 1.0, "b": 2.0}, {"a": 3.0}], ["a", "b"], both) == [1.0, 2.0, 3.0, 0.0]
    assert ledger.rewards_on_rows([{"a": 1.0, "b": 2.0}] * 2, ["a", "b"], both) == [1.0, 2.0] * 2
    assert not ledger.fast_path_ok({"c": 1.0}, observing)
    assert ledger.fast_path_ok({"a": 1.0, "c": 0.0}, observing)  # a turn-based env's zero
    ledger.settle({"c": 1.0}, [], _slots(), [])  # held for c
    assert not ledger.fast_path_ok({"a": 1.0}, observing)


def test_settle_holds_credits_forfeits_and_keeps_rewards_after_done() -> None:
    ledger = RewardLedger()
    slots = _slots(a=False, d=True)
    rewards = {"a": 1.0, "new": 2.0, "silent": 3.0, "d": 4.0, "born_done": 5.0}
    ledger.receive(rewards)
    rows = [("a", False), ("new", True)]
    assert ledger.settle(rewards, rows, slots, ["born_done"]) == [1.0, 0.0]
    assert ledger.held == {"new": 2.0, "silent": 3.0}
    # next round: held rewards go on the agents' next rows (a fake final obs counts too)
    assert ledger.settle({"new": 0.5}, [("new", False), ("silent", False)], slots, []) == [2.5, 3.0]
    assert ledger.held == {}
    # d was done: its 4.0 joins its final transition, once; after that a reward is late
    final = add_rewards_after_done(np.zeros(2, np.float32), [1], [(ledger, "d")])
    np.testing.assert_array_equal(final, [0.0, 4.0])
    ledger.settle({"d": 1.0}, [], slots, [])
    assert ledger.num_late_rewards == 1
    assert ledger.totals_with({}) == rewards


def test_add_rewards_after_done_copies_only_when_something_changes() -> None:
    rewards = np.ones(3, np.float32)
    assert add_rewards_after_done(rewards, [0], [(RewardLedger(), "a")]) is rewards


def test_step_timings_are_keyed_by_step_name_and_reported_as_phases() -> None:
    assert list(STEP_PHASES) == [
        "poll", "collect", "agent_connectors", "forward", "action_connectors", "store", "send",
        "build_fragments",
    ]
    assert set(STEP_PHASES.values()) <= set(PHASES)
    perf = PerfStats()
    perf.record_step(dict.fromkeys(STEP_PHASES, 0.001))
    stats = perf.get()
    assert stats["mean_env_wait_ms"] == pytest.approx(2.0)  # poll + send
    assert stats["mean_action_processing_ms"] == pytest.approx(3.0)
    with pytest.raises(KeyError):
        perf.record_step({"no_such_step": 0.1})


def test_column_buffer_grows_zero_fills_missing_columns_and_keeps_rows_in_order() -> None:
    buffer = ColumnBuffer()
    buffer.append({"keys": np.arange(3), "obs": np.ones((3, 2), np.float32)}, 3)
    buffer.append({"keys": np.arange(3, 303), "obs": np.ones((300, 2), np.float32), "a": np.full(300, 7)}, 300)
    buffer.append({"keys": np.array([303])}, 1)  # a round without obs or actions
    view = buffer.view()
    assert buffer.size == 304 and view["obs"].shape == (304, 2) and view["obs"].dtype == np.float32
    np.testing.assert_array_equal(view["keys"], np.arange(304))
    np.testing.assert_array_equal(view["a"][[0, 2, 3, 302, 303]], [0, 0, 7, 7, 0])
    assert view["obs"][303].tolist() == [0.0, 0.0]
    buffer.keep(np.array([303, 5]))
    np.testing.assert_array_equal(buffer.view()["keys"], [303, 5])
    buffer.append({"keys": np.array([9])}, 1)  # stale data past the kept rows is not read back
    np.testing.assert_array_equal(buffer.view()["a"], [0, 7, 0])
