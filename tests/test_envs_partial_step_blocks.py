"""Partial step blocks: a subprocess worker's reply that also carries resets (an episode
ended in one of its sub-envs), new key sets or pickled results still hands its other
sub-envs, those in the slot block whose episode goes on, over as rows of one StepBlock
(`subprocess_replies._rows_of_unended`), the rest as dicts, all in request order.

Purpose-built envs make each kind of mixed reply happen on cue: one or several
episode ends, an end beside a crash (restarts on and off), a failing reset, a reset
with other agents, an agent dying, non-empty infos, new key sets, truncation. For each,
the polls must equal SyncVectorEnv's for the same seed, and `materialize(poll_blocks())`
must equal, type for type and in dict order, what the same env gives with every mixed
reply read as dicts (the code before partial blocks). The runner's batches must equal
``vectorize: sync``'s.

Worker processes import this module to build its envs: nothing here imports torch at
import time (``marl_runner.EnvRunner`` is looked up when a test runs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from marl_runner import check_batch_invariants
from marl_runner.envs import SubprocessVectorEnv, SyncVectorEnv, subprocess_replies
from marl_runner.envs.errors import EnvError
from marl_runner.envs.multi_agent_env import MultiAgentDict, StepResult
from marl_runner.envs.registry import EnvFactory
from marl_runner.envs.step_block import BlockRow, StepBlock, materialize
from tests.envs import (
    CrashingEnvError,
    Round,
    ScriptedEnv,
    assert_identical,
    assert_same,
    play_vector_env,
)
from tests.runner_helpers import EpisodeTracker, assert_rewards_conserved, config
from tests.test_envs_step_blocks import BlockPolls
from tests.test_envs_subprocess_vector import play_per_env
from tests.test_runner_step_blocks_adversarial import (
    _METRICS,
    INTERLEAVED,
    ChaosEnv,
    _run,
    assert_finished_trajectories_equal,
    assert_same_batches,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

HERE = "tests.test_envs_partial_step_blocks"
AGENTS = ("a0", "a1", "a2", "a3")
STEADY = ("a0", "a1", "a2")
NUM_ENVS = 6  # two workers of three sub-envs: roles 0, 1, 2 in each
SEED = 11


# ---- envs whose sub-envs end, crash, spawn ... on cue


@dataclass(frozen=True)
class Episode:
    """One episode of a `PlanEnv`: its rounds, and the faults and infos it brings."""

    rounds: list[Round]
    crash_step: int | None = None  # the step call (1-based) that raises
    reset_fails: bool = False  # the first try to reset into this episode raises
    info_round: int | None = None  # the round whose infos are not empty
    malformed_step: int | None = None  # the step whose terminateds lack "__all__"


def rewards_of(k: int, role: int, agents: tuple = STEADY) -> dict[str, float]:
    """Round `k`'s rewards: every observer, in obs order, values per round and role."""
    return {agent: 0.125 * (k + i) - 0.5 * role for i, agent in enumerate(agents)}


def rounds_of(
    length: int, role: int, end: str = "terminated", agents: tuple = STEADY
) -> list[Round]:
    """A steady episode of `length` steps (every agent of `agents` observes and is
    rewarded every round), ended `end` (all agents flagged) on its last."""
    rounds = [Round(agents)]
    rounds += [Round(agents, rewards_of(k, role, agents)) for k in range(1, length)]
    rounds.append(last_round(length, role, agents, end))
    return rounds


def last_round(k: int, role: int, agents: tuple, end: str = "terminated") -> Round:
    """Round `k` ending the episode `end`, every agent of `agents` flagged."""
    return Round(agents, rewards_of(k, role, agents), end=end, **{end: agents})


def one_ends(role: int, episode: int) -> Episode:
    """Lengths 3, 5, 7: one sub-env of a worker ends while the others go on."""
    return Episode(rounds_of((3, 5, 7)[role], role, "truncated" if episode % 2 else "terminated"))


def several_end(role: int, episode: int) -> Episode:
    """Roles 0 and 1 end together (one terminated, one truncated), role 2 goes on."""
    end = "truncated" if role == 1 else "terminated"
    return Episode(rounds_of((4, 4, 6)[role], role, end))


def all_end(role: int, episode: int) -> Episode:
    """Every sub-env of a worker ends in the same reply: nothing is left for a block."""
    return Episode(rounds_of(4, role))


def end_and_crash(role: int, episode: int) -> Episode:
    """Role 0 ends on step 3 (its first episode), when role 1 crashes; role 2 goes on."""
    return Episode(rounds_of((3, 6, 6)[role], role), crash_step=3 if role == 1 else None)


def reset_fails(role: int, episode: int) -> Episode:
    """Role 0's reset into its second episode (sent with its end's reply) raises."""
    return Episode(rounds_of((3, 5, 6)[role], role), reset_fails=role == 0 and episode == 1)


def reset_other_agents(role: int, episode: int) -> Episode:
    """Odd episodes are played by a3 and a1 (in that order: not the slots' order), even
    ones by a0, a1, a2: a reset obs names other agents than the last step's, and the
    sub-envs of a worker look alike only when in episodes of the same parity."""
    agents = ("a3", "a1") if episode % 2 else STEADY
    return Episode(rounds_of((3, 5, 7)[role], role, agents=agents))


def agent_dies(role: int, episode: int) -> Episode:
    """Role 1's a2 dies on step 3 (a flag set, no episode end) when role 0 ends: no block
    for that reply; a1 and a0 play on."""
    if role != 1:
        return Episode(rounds_of((3, 0, 6)[role], role))
    both = ("a0", "a1")
    rounds = rounds_of(3, role)[:3] + [Round(STEADY, rewards_of(3, role), terminated=("a2",))]
    rounds += [Round(both, rewards_of(k, role, both)) for k in (4, 5)]
    return Episode([*rounds, last_round(6, role, both)])


def infos(role: int, episode: int) -> Episode:
    """Role 1 gives infos on step 3, when role 0 ends: pickled beside role 2's row."""
    return Episode(rounds_of((3, 6, 6)[role], role), info_round=3 if role == 1 else None)


def spawn(role: int, episode: int) -> Episode:
    """On step 3 a3 joins roles 1 and 2 (a key set new to the worker, numbered in the
    reply in which role 0 ends)."""
    if role == 0:
        return Episode(rounds_of(3, role))
    rounds = rounds_of(3, role)[:3]
    rounds += [Round(AGENTS, rewards_of(k, role, AGENTS)) for k in (3, 4, 5)]
    return Episode([*rounds, last_round(6, role, AGENTS)])


def int_rewards(role: int, episode: int) -> Episode:
    """Role 2's step 3 rewards are Python ints (kept ints, never a block's float64)."""
    rounds = rounds_of((3, 6, 6)[role], role)
    if role == 2:
        rounds[3] = Round(STEADY, {agent: i - 1 for i, agent in enumerate(STEADY)})
    return Episode(rounds)


def malformed(role: int, episode: int) -> Episode:
    """Role 1's step 3 result lacks terminateds["__all__"] when role 0 ends."""
    return Episode(rounds_of((3, 6, 6)[role], role), malformed_step=3 if role == 1 else None)


PLANS = {plan.__name__: plan for plan in (
    one_ends, several_end, all_end, end_and_crash, reset_fails, reset_other_agents,
    agent_dies, infos, spawn, int_rewards, malformed,
)}


class PlanEnv(ScriptedEnv):
    """Plays episodes of `PLANS[plan]` for its role (sub-env index % 3).

    The index is given (vector env tests) or read off the first seeded reset, whose seed
    is `base_seed + index + generation * num_envs` (the runner's `ResetSeeds`)."""

    def __init__(
        self, plan: str = "one_ends", index: int | None = None, base_seed: int = SEED,
        num_envs: int = NUM_ENVS,
    ) -> None:
        super().__init__([Round(STEADY, end="terminated")], AGENTS)
        self.plan = PLANS[plan]
        self.base_seed, self.num_envs = base_seed, num_envs
        self.role = None if index is None else index % 3
        self.episode = 0
        self.current = Episode(self.script)
        self.failed_reset = False

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        if self.role is None:
            self.role = (seed - self.base_seed) % self.num_envs % 3
        upcoming = self.plan(self.role, self.episode)
        if upcoming.reset_fails and not self.failed_reset:
            self.failed_reset = True
            raise CrashingEnvError(f"PlanEnv: planned crash resetting into episode {self.episode}")
        self.failed_reset = False
        self.current, self.script = upcoming, upcoming.rounds
        self.episode += 1
        return super().reset(seed=seed, options=options)

    def step(self, actions: MultiAgentDict) -> StepResult:
        if self._round + 1 == self.current.crash_step:
            raise CrashingEnvError(f"PlanEnv: planned crash in step {self.current.crash_step}")
        result = super().step(actions)
        if self._round == self.current.malformed_step:
            del result[2]["__all__"]
        return result

    def _info(self, agent: str) -> dict[str, Any]:
        return {"round": self._round} if self._round == self.current.info_round else {}


def planned(plan: str) -> Any:
    """A picklable `make_one(index)` of `PlanEnv`s playing `plan`."""
    return functools.partial(_make_plan_env, plan)


def _make_plan_env(plan: str, index: int) -> PlanEnv:
    return PlanEnv(plan, index)


# ---- what the replies hand out


@pytest.fixture
def partial_rows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list, list, list]]:
    """Per step reply read with `_rows_of_unended`: (sub-envs given as rows, sub-envs of
    the request, sub-envs reset with the reply)."""
    calls: list[tuple[list, list, list]] = []
    rows_of_unended = subprocess_replies._rows_of_unended

    def counting(slots: Any, request: list, results: list, resets: dict, local: dict) -> dict:
        rows = rows_of_unended(slots, request, results, resets, local)
        calls.append((list(rows), [env_id for env_id, _ in request], list(resets)))
        return rows

    monkeypatch.setattr(subprocess_replies, "_rows_of_unended", counting)
    return calls


def mixed(calls: list[tuple[list, list, list]]) -> list[tuple[list, list, list]]:
    """The replies that gave some of their sub-envs as rows and some as dicts."""
    return [call for call in calls if call[0] and len(call[0]) < len(call[1])]


class RecordedPolls(BlockPolls):
    """`BlockPolls` that also lists every `try_reset` and what it gave."""

    def __init__(self, vec: SubprocessVectorEnv) -> None:
        super().__init__(vec)
        self.resets: list[tuple[int, Any]] = []

    def try_reset(self, env_id: int, **kwargs: Any) -> Any:
        result = self.vec.try_reset(env_id, **kwargs)
        self.resets.append((env_id, result))
        return result


def _as_dicts(*args: Any) -> dict:
    """`_rows_of_unended` as before partial blocks: a mixed reply is all dicts."""
    return {}


def play_three_ways(
    monkeypatch: pytest.MonkeyPatch, make_one: Any, rounds: int, play: Any = play_vector_env,
    num_envs: int = NUM_ENVS, seed: int = SEED, **options: Any,
) -> tuple[Any, RecordedPolls]:
    """Sync, subprocess read through `poll_blocks` (materialized) and subprocess with
    mixed replies as dicts, all played alike: the first two equal, the last two
    identical. Returns the subprocess history and its `BlockPolls`."""
    both = dict(seed=seed, restart_failed=options.pop("restart_failed", False),
                check_env_outputs=options.pop("check_env_outputs", False))
    with SyncVectorEnv(make_one, num_envs, **both) as vec:
        sync = play(vec, rounds)
    kwargs = dict(num_workers=2, **both, **options)
    with SubprocessVectorEnv(make_one, num_envs, **kwargs) as vec:
        blocks = RecordedPolls(vec)
        from_blocks = play(blocks, rounds)
    with monkeypatch.context() as patched:
        patched.setattr(subprocess_replies, "_rows_of_unended", _as_dicts)
        with SubprocessVectorEnv(make_one, num_envs, **kwargs) as vec:
            as_dicts = play(vec, rounds)
    assert_same(sync, from_blocks)
    assert_identical(from_blocks, as_dicts)
    return from_blocks, blocks


# ---- each kind of mixed reply


@pytest.mark.parametrize(
    "plan, check",
    [("one_ends", False), ("one_ends", True), ("several_end", False),
     ("reset_other_agents", False), ("infos", False), ("spawn", False), ("spawn", True)],
)
def test_mixed_replies_equal_sync_and_the_dict_path(plan, check, monkeypatch, partial_rows):
    play_three_ways(monkeypatch, planned(plan), 22, check_env_outputs=check)
    assert mixed(partial_rows), partial_rows
    for rows, _, resets in partial_rows:
        assert not set(rows) & set(resets)  # an ended sub-env never comes as a row


@pytest.mark.parametrize("plan, restart", [("spawn", False), ("end_and_crash", True),
                                           ("reset_fails", True), ("infos", False)])
def test_materialized_poll_blocks_are_poll_of_an_identical_env(plan, restart, partial_rows):
    """Two identical envs played alike, one through `poll_blocks` (materialized), one
    through `poll`: the same values of the same types, dtypes and dict order."""
    kwargs = dict(seed=SEED, num_workers=2, restart_failed=restart)
    with (
        SubprocessVectorEnv(planned(plan), NUM_ENVS, **kwargs) as with_blocks,
        SubprocessVectorEnv(planned(plan), NUM_ENVS, **kwargs) as with_poll,
    ):
        from_blocks = play_vector_env(BlockPolls(with_blocks), 16)
        assert_identical(from_blocks, play_vector_env(with_poll, 16))
    assert mixed(partial_rows)


def test_int_rewards_beside_an_episode_end_leave_the_reply_dicts(monkeypatch, partial_rows):
    """Step 3: role 0 ends, role 2's rewards are ints: roles 1 and 2 no longer look
    alike (an int reward is no block's float64), so neither comes as a row."""
    play_three_ways(monkeypatch, planned("int_rewards"), 16)
    assert ([], [0, 1, 2], [0]) in partial_rows and ([], [3, 4, 5], [3]) in partial_rows


def test_a_reply_whose_sub_envs_all_end_has_no_rows(monkeypatch, partial_rows):
    _, blocks = play_three_ways(monkeypatch, planned("all_end"), 14)
    ended_replies = [call for call in partial_rows if call[2]]
    assert ended_replies
    assert all(set(resets) == set(request) for _, request, resets in ended_replies)
    assert not any(rows for rows, _, _ in ended_replies)
    assert any(blocks.block_rows)  # the steady rounds between come as blocks


def test_an_agent_dying_beside_an_episode_end_leaves_the_reply_dicts(monkeypatch, partial_rows):
    """Step 3: role 0 ends, role 1's a2 dies, role 2 goes on: one flag set among the
    sub-envs that go on keeps them all out of a block."""
    play_three_ways(monkeypatch, planned("agent_dies"), 16)
    third = [call for call in partial_rows if call[2] and {0, 3} & set(call[2])]
    assert third and all(rows == [] for rows, _, _ in third[:2]), partial_rows[:6]


@pytest.mark.parametrize("restart", [True, False])
def test_an_end_beside_a_crash_equals_sync(restart, monkeypatch, partial_rows):
    history, _ = play_three_ways(monkeypatch, planned("end_and_crash"), 16, restart_failed=restart)
    crashed = [poll for poll, _ in history if isinstance(poll[0].get(1), Exception)]
    assert crashed
    # The reply of step 3: role 0 ended, role 1 crashed, role 2 a row.
    assert ([2], [0, 1, 2], [0]) in partial_rows and ([5], [3, 4, 5], [3]) in partial_rows


@pytest.mark.parametrize("restart", [True, False])
def test_a_failing_reset_sent_with_the_reply_equals_sync(restart, monkeypatch, partial_rows):
    _, blocks = play_three_ways(monkeypatch, planned("reset_fails"), 16, restart_failed=restart)
    failed = [env_id for env_id, (obs, _) in blocks.resets if isinstance(obs, Exception)]
    # Once per env object: a recreated one (restarts on) fails again in its second reset.
    assert failed[:2] == [0, 3] and set(failed) == {0, 3}, blocks.resets
    assert restart or len(failed) == 2
    assert ([1, 2], [0, 1, 2], [0]) in partial_rows


@pytest.mark.parametrize("per_poll", [{"num_envs_per_poll": 2}, {"async_poll": True}])
def test_async_pools_mixed_replies_equal_sync(per_poll, monkeypatch, partial_rows):
    play_three_ways(monkeypatch, planned("one_ends"), 14, play=play_per_env, **per_poll)
    assert any(rows and resets for rows, _, resets in partial_rows), partial_rows


def test_rows_come_in_request_order_among_the_dicts(partial_rows):
    """Actions sent last sub-env first: the poll lists the sub-envs in that order, block
    rows and dicts alike, and the rows of a mixed reply are one block."""
    order = list(range(NUM_ENVS))[::-1]
    make_one = planned("one_ends")
    with SubprocessVectorEnv(make_one, NUM_ENVS, seed=SEED, num_workers=2) as vec:
        seen_mixed = 0
        polled = vec.poll_blocks()
        for _ in range(12):
            act = {}
            obs, _, terminateds, truncateds, _, _ = materialize(polled)
            for env_id in order:
                if terminateds[env_id]["__all__"] or truncateds[env_id]["__all__"]:
                    obs[env_id], _ = vec.try_reset(env_id)
                act[env_id] = dict.fromkeys(obs[env_id], 0)
            vec.send_actions(act)
            polled = vec.poll_blocks()
            assert list(polled[0]) == order
            kinds = [type(entry) is BlockRow for entry in polled[0].values()]
            blocks = {id(row.block) for row in polled[0].values() if type(row) is BlockRow}
            if any(kinds) and not all(kinds):
                seen_mixed += 1
                assert len(blocks) <= 2  # one per worker at most
        assert seen_mixed >= 3 and mixed(partial_rows)


def test_a_mixed_reply_replaces_what_an_earlier_reply_of_its_sub_envs_left(
    monkeypatch, partial_rows
):
    """Stepped again before a poll: a mixed reply's rows drop what the earlier reply left
    for their sub-envs (an ended step's dicts), its dicts replace the earlier rows."""
    act = dict.fromkeys(STEADY, 0)

    def play() -> list:
        polls = []
        with SubprocessVectorEnv(planned("one_ends"), 3, seed=SEED, num_workers=1) as vec:
            vec.poll()
            # Sub-env 0 ends on steps 3, 6, 9, sub-env 1 on 5, 10, sub-env 2 on 7: of
            # steps (6, 7) both replies are mixed, of (8, 9) the second.
            for sends in (1, 1, 2, 1, 2, 2, 2):
                for _ in range(sends):
                    vec.send_actions({env_id: act for env_id in range(3)})
                polled = vec.poll_blocks()
                for env_id, entry in polled[0].items():
                    if type(entry) is BlockRow:
                        assert all(env_id not in part for part in polled[1:]), (env_id, polled)
                polls.append(materialize(polled))
        return polls

    with_rows = play()
    assert [rows for rows, _, _ in mixed(partial_rows)] == [[1, 2], [0, 2], [1, 2], [0, 1],
                                                            [1, 2], [0, 2]]
    monkeypatch.setattr(subprocess_replies, "_rows_of_unended", _as_dicts)
    assert_identical(with_rows, play())


def test_malformed_output_beside_an_episode_end_with_restarts_equals_sync(
    monkeypatch, partial_rows
):
    history, _ = play_three_ways(monkeypatch, planned("malformed"), 14, restart_failed=True)
    assert any(isinstance(poll[0].get(1), Exception) for poll, _ in history)
    assert ([2], [0, 1, 2], [0]) in partial_rows


def test_malformed_output_beside_an_episode_end_raises_as_sync_does(partial_rows):
    """Restarts off: the poll that reads the mixed reply raises the sub-env's bad output,
    as sync's does; the results of that round stay for the next poll."""
    make_one = planned("malformed")
    raised = []
    for vec in (SyncVectorEnv(make_one, 3, seed=SEED),
                SubprocessVectorEnv(make_one, 3, seed=SEED, num_workers=1)):
        with vec:
            history = play_vector_env(vec, 3)
            with pytest.raises(EnvError) as error:
                play_vector_env(vec, 1)
            raised.append((history, str(error.value), materialize(vec.poll())))
    (sync, sync_error, sync_rest), (sub, sub_error, sub_rest) = raised
    assert_same(sync, sub)
    assert "__all__" in sync_error and "__all__" in sub_error, (sync_error, sub_error)
    assert_same(sync_rest, sub_rest)
    assert ([2], [0, 1, 2], [0]) in partial_rows


class RetriedPolls(BlockPolls):
    """`BlockPolls` whose poll, interrupted, is called again (as a runner's retried sample
    polls again); `interrupted` counts those."""

    interrupted = 0

    def poll(self) -> tuple[dict, ...]:
        try:
            return super().poll()
        except KeyboardInterrupt:
            self.interrupted += 1
            return super().poll()


def test_an_interrupt_while_a_mixed_reply_is_entered_loses_nothing(monkeypatch, partial_rows):
    """A Ctrl-C while the rows of a mixed reply are made: the reply stays unread, the next
    poll enters it again (its key sets, rows, dicts and resets) as if never interrupted."""
    make_one = planned("spawn")
    with SyncVectorEnv(make_one, NUM_ENVS, seed=SEED) as vec:
        sync = play_vector_env(vec, 14)
    rows = StepBlock.rows
    planned_interrupts = [3, 2]  # rows of 3 sub-envs first, then of 2 (a mixed reply)

    def interrupted(self: StepBlock) -> list:
        if planned_interrupts and len(self.env_ids) == planned_interrupts[0]:
            planned_interrupts.pop(0)
            raise KeyboardInterrupt("planned interrupt while a reply is entered")
        return rows(self)

    monkeypatch.setattr(StepBlock, "rows", interrupted)
    with SubprocessVectorEnv(make_one, NUM_ENVS, seed=SEED, num_workers=2) as vec:
        polls = RetriedPolls(vec)
        assert_same(sync, play_vector_env(polls, 14))
    assert polls.interrupted == 2 and not planned_interrupts
    assert mixed(partial_rows)


def _chaos_env(index: int, crash_rate: float = 0.0, obs: str = "box") -> ChaosEnv:
    return ChaosEnv(obs=obs, steady=0.7, most_rounds=8, crash_rate=crash_rate)


SLOW = pytest.mark.slow  # (the other cases of the test run by default)


@pytest.mark.parametrize(
    "seed, restart, crash_rate, obs",
    [pytest.param(1, False, 0.0, "box", marks=SLOW), (2, True, 0.05, "box"),
     (3, True, 0.05, "uint8"), pytest.param(4, False, 0.0, "float64_sometimes", marks=SLOW),
     pytest.param(5, False, 0.0, "box0", marks=SLOW)],
)
def test_chaos_sub_envs_equal_sync_and_the_dict_path(
    seed, restart, crash_rate, obs, monkeypatch, partial_rows
):
    """ChaosEnv's random episodes (agents dying and spawning, observers shuffled, rewards
    for agents without an obs, 3 to 8 rounds), three sub-envs per worker."""
    make_one = functools.partial(_chaos_env, crash_rate=crash_rate, obs=obs)
    play_three_ways(monkeypatch, make_one, 40, seed=seed, restart_failed=restart)
    assert len(mixed(partial_rows)) >= 3, partial_rows


# ---- real PettingZoo envs

KAZ = {"name": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
       "config": {"obs_method": "vector", "max_cycles": 20, "spawn_delay": 4}}
SPREAD = {"name": "mpe2.simple_spread_v3:parallel_env",
          "config": {"N": 3, "max_cycles": 5, "continuous_actions": False}}
CONNECT_FOUR = {"name": "pettingzoo.classic.connect_four_v3:env", "api": "aec"}


@pytest.mark.parametrize(
    "env_config, rounds, least_mixed",
    [
        # KAZ's rewards are Python ints (kept ints): never a block, nothing to mix.
        pytest.param(KAZ, 50, 0, id="kaz", marks=SLOW),
        pytest.param(SPREAD, 14, 0, id="simple_spread"),
        pytest.param(CONNECT_FOUR, 30, 0, id="connect_four"),
    ],
)
def test_pettingzoo_envs_equal_sync_and_the_dict_path(
    env_config, rounds, least_mixed, monkeypatch, partial_rows
):
    play_three_ways(monkeypatch, EnvFactory(env_config), rounds, num_envs=4)
    assert len(mixed(partial_rows)) >= least_mixed, partial_rows


# ---- the runner: batches equal sync's


def _plan_run(plan: str, seed: int, **more: Any) -> dict:
    return dict(
        env_name=f"{HERE}:PlanEnv", num_envs=NUM_ENVS, rollout_fragment_length=10, seed=seed,
        env_config={"plan": plan, "base_seed": seed, "num_envs": NUM_ENVS}, **more,
    )


RUNNER_CASES = {
    "one_ends_interleaved_fake_obs_last": _plan_run("one_ends", 31, fake_obs="last", **INTERLEAVED),
    "several_end_complete_episodes_agent_steps": _plan_run(
        "several_end", 32, batch_mode="complete_episodes", count_steps_by="agent_steps"
    ),
    "spawn_interleaved": _plan_run("spawn", 33, **INTERLEAVED),
    "agent_dies_fake_obs_zeros": _plan_run("agent_dies", 34, fake_obs="zeros", **INTERLEAVED),
    "reset_other_agents_interleaved": _plan_run("reset_other_agents", 35, **INTERLEAVED),
    "infos": _plan_run("infos", 36),
    "int_rewards": _plan_run("int_rewards", 37, **INTERLEAVED),
    "end_and_crash_restarted": _plan_run(
        "end_and_crash", 38, restart_failed_sub_environments=True,
        max_consecutive_step_failures=50,
    ),
    "reset_fails_restarted": _plan_run(
        "reset_fails", 39, restart_failed_sub_environments=True,
        max_consecutive_reset_failures=50, max_consecutive_step_failures=50,
    ),
    "malformed_restarted": _plan_run(
        "malformed", 40, restart_failed_sub_environments=True, max_consecutive_step_failures=50,
        **INTERLEAVED,
    ),
}


@pytest.mark.parametrize("case", sorted(RUNNER_CASES))
def test_runner_batches_equal_sync(case: str, partial_rows) -> None:
    cfg_args = RUNNER_CASES[case]
    sync, sync_metrics = _run(cfg_args, "sync", 60, 2)
    parallel, parallel_metrics = _run(cfg_args, "subprocess", 60, 2)
    assert_same_batches(sync, parallel)
    for first, second in zip(sync_metrics, parallel_metrics):
        for key in _METRICS:
            np.testing.assert_equal(first.get(key), second.get(key), err_msg=key)
    assert partial_rows and any(rows for rows, _, _ in partial_rows)


@pytest.mark.parametrize("per_poll", [{"num_envs_per_poll": 2}, {"async_poll": True}])
def test_runner_async_pools_play_each_sub_env_as_sync_does(per_poll, partial_rows) -> None:
    """PlanEnv ignores the action values, so each sub-env plays the same episodes whatever
    the timing: each finished episode's trajectories equal sync's."""
    cfg_args = _plan_run("spawn", 41, fake_obs="last")
    sync, _ = _run(cfg_args, "sync", 120, 1)
    parallel, _ = _run({**cfg_args, **per_poll}, "subprocess", 120, 1)
    assert_finished_trajectories_equal(sync[0], parallel[0], 30)
    assert any(rows and resets for rows, _, resets in partial_rows), partial_rows


class PlannedRewards:
    """Stands in for a runner in `assert_rewards_conserved`: its sub-envs' reward logs
    are what `PLANS[plan]` hands out, episode by episode (the subprocess env's own
    sub-envs live in the workers)."""

    def __init__(self, plan: str, tracker: EpisodeTracker) -> None:
        logs = [
            [_episode_rewards(PLANS[plan](env_index % 3, episode)) for episode in range(len(ids))]
            for env_index, ids in sorted(tracker.started.items())
        ]
        sub_envs = [SimpleNamespace(reward_log=log) for log in logs]
        self.env = SimpleNamespace(get_sub_environments=lambda: sub_envs)


def _episode_rewards(episode: Episode) -> dict[str, float]:
    totals: dict[str, float] = {}
    for round_ in episode.rounds[1:]:  # round 0 is the reset: no rewards
        for agent, reward in round_.rewards.items():
            totals[agent] = totals.get(agent, 0.0) + reward
    return totals


@pytest.mark.parametrize("plan", ["one_ends", "spawn", "agent_dies", "reset_other_agents"])
def test_runner_rewards_conserved_per_agent(plan, partial_rows) -> None:
    import marl_runner

    tracker = EpisodeTracker()
    cfg = config(**_plan_run(plan, 42, **INTERLEAVED), vectorize="subprocess", num_workers=2)
    with marl_runner.EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_env_steps=120)
        check_batch_invariants(batch, rollout_fragment_length=cfg.rollout_fragment_length)
        assert_rewards_conserved(batch, PlannedRewards(plan, tracker), tracker, min_episodes=12)
    assert any(rows for rows, _, _ in partial_rows)


def test_rows_of_agents_out_of_slot_order(monkeypatch, partial_rows):
    """Step 9: role 0 ends while roles 1 and 2 both play a3, a1 (rows read at slots 3, 1);
    step 10: role 1 ends while roles 0 and 2 do."""
    play_three_ways(monkeypatch, planned("reset_other_agents"), 12)
    assert partial_rows.count(([1, 2], [0, 1, 2], [0])) == 2  # steps 3 and 9
    assert ([0, 2], [0, 1, 2], [1]) in partial_rows
