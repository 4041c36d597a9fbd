"""`EnvRunner.flush()` and `request_stop()`: the end of a run hands out every transition
sampled and not yet in a batch, so every finished episode gets out, and nothing is handed
out twice; sampling goes on afterwards as if no flush had happened."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from connectors import AgentConnector
from connectors.data import AgentRows
from marl_runner import Callbacks, EnvRunner, MultiAgentBatch, check_batch_invariants
from marl_runner.bench.envs import CheapEnv
from tests.runner_helpers import config

MLP = {"model": {"type": "mlp", "hidden": [8]}}
ENVS = {
    "kaz": (
        "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env",
        {"obs_method": "vector", "max_cycles": 40},
    ),
    "connect_four": ("pettingzoo.classic.connect_four_v3:env", {}),
    "battle": ("magent2.environments.battle_v4:parallel_env", {"map_size": 16, "max_cycles": 30}),
}
COLUMNS = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "action_logp")


def _config(env: str, **overrides: Any) -> Any:
    name, env_config = ENVS[env]
    settings = {"num_envs": 2, "rollout_fragment_length": 13, "seed": 4, **overrides}
    return config(name, env_config=env_config, policies={"shared": MLP}, **settings)


def _rows(batches: list[MultiAgentBatch]) -> dict[str, np.ndarray]:
    """Every transition of the batches, sorted by (sub-env, its n-th episode, agent, t):
    a run's data independent of where its fragments were cut (episode ids are random)."""
    policy_batches = [b.policy_batches["shared"] for b in batches if b.policy_batches]
    columns = {name: np.concatenate([pb[name] for pb in policy_batches]) for name in COLUMNS}
    env_ids, eps_ids, agents, ts = (
        np.concatenate([pb[name] for pb in policy_batches])
        for name in ("env_id", "eps_id", "agent_index", "t")
    )
    # Fragments are handed out in time order, so episodes appear in the order they started.
    nth: dict[int, int] = {}
    per_env: dict[int, int] = {}
    for env_id, eps_id in zip(env_ids.tolist(), eps_ids.tolist()):
        if eps_id not in nth:
            nth[eps_id] = per_env[env_id] = per_env.get(env_id, -1) + 1
    ids = [env_ids, np.array([nth[e] for e in eps_ids.tolist()]), agents, ts]
    order = np.lexsort(ids[::-1])
    keys = np.stack(ids, axis=1)[order]
    assert not (keys[1:] == keys[:-1]).all(axis=1).any(), "a transition was handed out twice"
    return {"keys": keys, **{name: column[order] for name, column in columns.items()}}


def _run(env: str, rounds: int, flush_at: set[int], **overrides: Any) -> list[MultiAgentBatch]:
    """``rounds`` runner steps, flushing after the listed ones, and a flush at the end."""
    batches = []
    with EnvRunner(_config(env, **overrides)) as runner:
        for round_index in range(rounds):
            batches.extend(item for item in runner.step() if isinstance(item, MultiAgentBatch))
            if round_index in flush_at:
                flushed = runner.flush()
                check_batch_invariants(flushed)
                # The first round only resets; every later one closes transitions.
                assert (flushed.env_steps() > 0) == (round_index > 0)
                batches.append(flushed)
        batches.append(runner.flush())
    return batches


@pytest.mark.parametrize(
    ("env", "vectorize"),
    [("kaz", "sync"), ("connect_four", "sync"), ("battle", "sync"), ("battle", "subprocess")],
)
def test_flushes_hand_out_the_same_transitions_as_a_run_without_them(env: str, vectorize: str) -> None:
    """Agents dying (KAZ, battle), turns (Connect Four), sub-envs in worker processes: the
    flushed run's transitions are exactly the plain sync run's (same seeds), each once;
    every batch passes the checks."""
    plain = _rows(_run(env, 60, set()))
    flushed_batches = _run(env, 60, {0, 5, 6, 20, 31, 47}, vectorize=vectorize)  # none at a fragment's end
    for batch in flushed_batches:
        check_batch_invariants(batch)
    flushed = _rows(flushed_batches)
    np.testing.assert_array_equal(flushed["keys"], plain["keys"])
    for name in COLUMNS:
        np.testing.assert_array_equal(flushed[name], plain[name], err_msg=name)
    ends = flushed["terminateds"] | flushed["truncateds"]
    assert ends.any(), "no episode ended: the test would not check finished episodes"


def test_a_flush_right_after_a_sample_hands_out_nothing() -> None:
    with EnvRunner(_config("kaz")) as runner:
        runner.sample()
        empty = runner.flush()
        assert empty.env_steps() == 0 and empty.agent_steps() == 0
        assert runner.sample().env_steps() == 2 * 13  # a whole fragment per sub-env, as ever


class StopAtThirdEpisodeEnd(Callbacks):
    """Asks the runner to stop when the third episode ends, as a Ctrl-C handler would."""

    def __init__(self) -> None:
        self.ended = 0

    def on_episode_end(self, *, runner: Any = None, **kwargs: Any) -> None:
        self.ended += 1
        if self.ended == 3:
            runner.request_stop()


def test_request_stop_ends_sample_at_the_round_with_every_finished_episode() -> None:
    """Connect Four episodes (~20 rounds) in fragments of 100: ``sample()`` returns at the
    round of the third episode's end, with all three to their last rows; the next
    ``sample()`` is whole again."""
    cfg = _config("connect_four", rollout_fragment_length=100,
                  callbacks="tests.test_runner_flush:StopAtThirdEpisodeEnd")
    with EnvRunner(cfg) as runner:
        batch = runner.sample()
        check_batch_invariants(batch)
        assert 0 < batch.env_steps() < 2 * 100
        shared = batch.policy_batches["shared"]
        ended_episodes = {int(e) for e in shared["eps_id"][shared["terminateds"] | shared["truncateds"]]}
        assert len(ended_episodes) == runner.callbacks.ended == 3
        assert runner.get_metrics()["episodes"] == 3
        assert runner.sample().env_steps() == 2 * 100


def test_a_stop_in_a_round_that_ends_no_episode_still_returns_a_multi_agent_batch() -> None:
    """(Found by a probe.) complete_episodes, stop asked before a round in which no
    episode ends: ``sample()`` hands out nothing, as an empty MultiAgentBatch, which the
    CLI's stop path counts (a SampleBatch there ended the run with an AttributeError)."""
    with EnvRunner(_config("kaz", batch_mode="complete_episodes")) as runner:
        runner.request_stop()
        batch = runner.sample()
    assert isinstance(batch, MultiAgentBatch)
    assert batch.env_steps() == batch.agent_steps() == 0


def test_complete_episodes_mode_has_nothing_to_flush() -> None:
    """Fragments there are whole episodes, built when they end: a running one is never cut."""
    with EnvRunner(_config("kaz", batch_mode="complete_episodes")) as runner:
        for _ in range(30):
            runner.step()
        flushed = runner.flush()
        assert flushed.env_steps() == 0 and flushed.agent_steps() == 0


def _cheap(**overrides: Any) -> Any:
    return config(
        "marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2, "episode_len": 5},
        rollout_fragment_length=5, seed=1, **overrides,
    )


class StopAtFirstEpisodeEnd(Callbacks):
    """Asks for a stop in the round that also completes the first fragments."""

    def __init__(self) -> None:
        self.asked = False

    def on_episode_end(self, *, runner: Any = None, **kwargs: Any) -> None:
        if not self.asked:
            self.asked = True
            runner.request_stop()


def test_a_stop_asked_in_the_last_round_of_a_sample_is_used_up_by_it() -> None:
    """Episodes of 5 rounds, fragments of 5: the first episodes end in the round that
    completes the first sample, which takes the stop; the next sample is whole."""
    with EnvRunner(_cheap(callbacks="tests.test_runner_flush:StopAtFirstEpisodeEnd")) as runner:
        assert runner.sample().env_steps() == 2 * 5
        assert runner.sample().env_steps() == 2 * 5


class FailingHooks(Callbacks):
    """``on_sample_end`` fails once; ``on_postprocess_trajectory`` while ``failing``."""

    def __init__(self) -> None:
        self.sample_ends = 0
        self.failing = False

    def on_sample_end(self, **kwargs: Any) -> None:
        self.sample_ends += 1
        if self.sample_ends == 1:
            raise RuntimeError("on_sample_end broke")

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        if self.failing:
            raise RuntimeError("postprocessing broke")


def test_a_flush_that_raises_lets_nothing_go() -> None:
    """A sample that raised leaves its fragments for the next call; a flush whose own
    build raises (a post-processing hook) keeps them too, and the next flush hands them
    out with the rows since."""
    with EnvRunner(_cheap(callbacks="tests.test_runner_flush:FailingHooks")) as runner:
        with pytest.raises(RuntimeError, match="on_sample_end broke"):
            runner.sample()
        for _ in range(3):
            runner.step()
        runner.callbacks.failing = True
        with pytest.raises(RuntimeError, match="postprocessing broke"):
            runner.flush()
        runner.callbacks.failing = False
        assert runner.flush().env_steps() == 2 * 5  # the raising sample's fragments
        # (the 3 rounds since went into the failed build's fragments: gone with it, as a
        # fragment whose post-processing raises in sample() is)



class _RaisesOnCall(AgentConnector):
    """Raises on its ``number``-th call: the runner step of that round stops part-way."""

    def __init__(self, ctx: Any, number: int) -> None:
        super().__init__(ctx)
        self.number, self.calls = number, 0

    def __call__(self, rows: AgentRows) -> AgentRows:
        self.calls += 1
        if self.calls == self.number:
            raise RuntimeError("agent connector broke")
        return rows


def _first_two_episodes_whole(batch: MultiAgentBatch) -> None:
    """Each sub-env's first two episodes (3 steps, 2 agents) are in ``batch``, whole."""
    shared = batch.policy_batches["shared"]
    for env_id in (0, 1):
        rows = shared["env_id"] == env_id
        for eps_id in list(dict.fromkeys(shared["eps_id"][rows].tolist()))[:2]:
            mine = shared["eps_id"] == eps_id
            assert sorted(shared["t"][mine].tolist()) == [0, 0, 1, 1, 2, 2]
            assert (shared["terminateds"][mine] | shared["truncateds"][mine]).sum() == 2


def step_into_a_broken_round(runner: EnvRunner, number: int) -> None:
    """Runner steps until the ``number``-th, whose agent connector raises (part-way)."""
    pipeline = runner.policy_map.entries["shared"].agent_pipeline
    pipeline.append(_RaisesOnCall(pipeline.ctx, number))
    for _ in range(number - 1):
        runner.step()
    with pytest.raises(RuntimeError, match="agent connector broke"):
        runner.step()


@pytest.mark.parametrize("then", ["flush", "sample"])
@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
@pytest.mark.parametrize("failing_round", [9, 10])
def test_a_step_that_raises_keeps_the_episodes_that_ended_before_it(
    failing_round: int, count_steps_by: str, then: str
) -> None:
    """Episodes of 3 steps (2 agents), fragments of 20: the first two episodes of each
    sub-env end in rounds 4 and 7, unbuilt. A step that raises in round 9 (the third
    episodes running) or 10 (they end in it, and the fourth start) drops only the episodes
    of that round. The first two go out whole, in a flush or in the next sample, and the
    steps counted towards fragments are exactly theirs: the fragments are exact."""
    cfg = config(
        "marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2, "episode_len": 3},
        rollout_fragment_length=20, seed=3, count_steps_by=count_steps_by,
    )
    steps_per_fragment = 20 if count_steps_by == "env_steps" else 10
    with EnvRunner(cfg) as runner:
        step_into_a_broken_round(runner, failing_round)
        if then == "flush":
            flushed = runner.flush()
            check_batch_invariants(flushed)
            _first_two_episodes_whole(flushed)
            # Nothing else: 2 sub-envs x 2 episodes x 3 steps (x 2 agents).
            assert flushed.env_steps() == 12 and flushed.agent_steps() == 24
        after = runner.sample()
        assert runner.get_metrics()["num_faulty_episodes"] == 2
    check_batch_invariants(after)
    if then == "sample":
        _first_two_episodes_whole(after)
    assert after.env_steps() == 2 * steps_per_fragment
    per_env = np.bincount(after.policy_batches["shared"]["env_id"], minlength=2)
    assert per_env.tolist() == [2 * steps_per_fragment] * 2


class FailsSecondReset(CheapEnv):
    """CheapEnv whose second reset raises (once): right after its first episode ended."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.resets = 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.resets += 1
        if self.resets == 2:
            raise RuntimeError("reset broke")
        return super().reset(seed=seed, options=options)


def test_a_failed_reset_after_an_episode_end_keeps_that_episodes_agent_steps() -> None:
    """Counting agent steps: the new episode dropped by its failed reset came after the
    ended one's last agent steps were counted in the same round (they are stored after
    the reset); they stay counted, so every fragment has exactly 10 agent steps."""
    cfg = config(
        "tests.test_runner_flush:FailsSecondReset", env_config={"num_agents": 2, "episode_len": 3},
        num_envs=1, rollout_fragment_length=10, seed=3, count_steps_by="agent_steps",
    )
    with EnvRunner(cfg) as runner:
        batches = [runner.sample() for _ in range(4)]
        assert runner.get_metrics()["num_faulty_episodes"] == 1
    for batch in batches:
        check_batch_invariants(batch)
        assert batch.agent_steps() == 10


class FailsAtFifthEpisodeEnd(Callbacks):
    """``on_episode_end`` raises for the fifth episode to end."""

    def __init__(self) -> None:
        self.ended = 0

    def on_episode_end(self, **kwargs: Any) -> None:
        self.ended += 1
        if self.ended == 5:
            raise RuntimeError("on_episode_end broke")


def test_an_episode_end_callback_that_raises_drops_only_that_episode() -> None:
    """Two sub-envs in step, episodes of 3 steps: the third episodes end in the same
    round, and the first of them to end breaks the callback. The four episodes before go
    out whole in the flush; the broken one leaves no row behind, in the flush or later
    (its rows, not yet handed out, would otherwise stay in the store for good)."""
    cfg = config(
        "marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2, "episode_len": 3},
        rollout_fragment_length=20, seed=3,
        callbacks="tests.test_runner_flush:FailsAtFifthEpisodeEnd",
    )
    with EnvRunner(cfg) as runner:
        with pytest.raises(RuntimeError, match="on_episode_end broke"):
            runner.sample()
        flushed = runner.flush()
        after = [runner.sample() for _ in range(2)]
    check_batch_invariants(flushed)
    _first_two_episodes_whole(flushed)
    assert flushed.env_steps() == 12 and flushed.agent_steps() == 24
    for batch in after:
        check_batch_invariants(batch)
        assert batch.env_steps() == 2 * 20 and batch.agent_steps() == 2 * 2 * 20
    # Every sub-env started afresh after the flush: no trajectory of the next batch
    # continues one (a row of the broken episode left in the store would).
    assert not after[0].policy_batches["shared"]["continues"].any()


class FailsOnEveryFaultyEpisodeEnd(Callbacks):
    """``on_episode_end`` raises for every faulty episode (it is told its exception)."""

    def on_episode_end(self, *, exception: BaseException | None = None, **kwargs: Any) -> None:
        if exception is not None:
            raise RuntimeError("on_episode_end broke on a faulty episode")


def test_a_callback_raising_while_a_step_is_recovered_leaves_no_sub_env_behind() -> None:
    """A step raises (an agent connector); the next step drops its sub-envs' episodes, and
    the callback raises for the first of them. Every sub-env is reset all the same and
    samples on: one left out would never be polled again (``sample()`` would wait for its
    fragment forever)."""
    cfg = config(
        "marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2, "episode_len": 3},
        num_envs=3, rollout_fragment_length=5, seed=3,
        callbacks="tests.test_runner_flush:FailsOnEveryFaultyEpisodeEnd",
    )
    with EnvRunner(cfg) as runner:
        step_into_a_broken_round(runner, 3)
        with pytest.raises(RuntimeError, match="broke on a faulty episode"):
            runner.step()
        batches = []
        for _ in range(20):  # bounded: enough for every sub-env's next fragment
            batches.extend(b for b in runner.step() if isinstance(b, MultiAgentBatch))
        stepped = {int(e) for b in batches for e in b.policy_batches["shared"]["env_id"]}
    assert stepped == {0, 1, 2}
    for batch in batches:
        check_batch_invariants(batch)


@pytest.mark.parametrize("batch_mode", ["complete_episodes", "truncate_episodes"])
def test_episodes_kept_out_of_training_leave_no_rows_and_hold_no_keys(batch_mode: str) -> None:
    """(Found in review.) Sub-env 1 keeps every other episode out of training, and its
    next episode starts in the round one ends. The ended one's last rows are kept out
    too, and its trajectory keys stay its own until that round is stored: before, they
    were freed first, its last rows were stored under them, and a new episode taking
    them got those rows in its trajectories (or the build failed with an IndexError)."""
    cfg = config(
        "marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2, "episode_len": 3},
        rollout_fragment_length=5, seed=0, batch_mode=batch_mode,
    )
    starts = {0: 0, 1: 0}

    def training_enabled(env_id: int) -> bool:
        starts[env_id] += 1
        return env_id == 0 or starts[env_id] % 2 == 0

    batches = []
    with EnvRunner(cfg) as runner:
        runner.env.training_enabled = training_enabled
        for _ in range(40):
            batches += [b for b in runner.step() if isinstance(b, MultiAgentBatch)]
        batches.append(runner.flush())
        live_keys = sum(owner is not None for owner in runner._key_table.episode)
        # (An episode kept out that ended in the last round frees its keys in the next.)
        running_slots = sum(
            len(e.slots)
            for e in [*runner._episodes.active.values(), *runner._episodes._untrained_ended]
        )
    times: dict[tuple[int, int], list[int]] = {}
    env_of: dict[int, int] = {}
    for batch in batches:
        check_batch_invariants(batch)
        if not batch.policy_batches:
            continue
        shared = batch.policy_batches["shared"]
        for env_id, eps_id, agent, t in zip(
            shared["env_id"].tolist(), shared["eps_id"].tolist(),
            shared["agent_index"].tolist(), shared["t"].tolist(),
        ):
            times.setdefault((eps_id, agent), []).append(t)
            env_of[eps_id] = env_id
    for key, ts in times.items():  # each whole so far, none with another's rows
        assert sorted(ts) == list(range(len(ts))) and len(ts) <= 3, (key, ts)
    per_env = [sum(env == env_id for env in env_of.values()) for env_id in (0, 1)]
    # Every episode of sub-env 0, every other one of sub-env 1 (both 14 starts, in rounds
    # 0, 3, ..., 39: the last, trained on both, has no transition yet).
    assert starts == {0: 14, 1: 14} and per_env == [13, 6]
    assert live_keys == running_slots


class FailsFourthPostprocessing(Callbacks):
    """``on_postprocess_trajectory`` raises on its fourth call (once)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls == 4:
            raise RuntimeError("postprocessing broke")


def test_complete_episodes_a_failed_build_hands_out_no_empty_fragments() -> None:
    """(Found in review.) complete_episodes, two sub-envs in step: their first episodes
    end in the same round, and post-processing the second one's second trajectory raises.
    That fragment is lost with it (its rows left the store), but it is neither built again
    (as an empty fragment still claiming its env steps) nor holds its keys; the first
    episode's fragment, built before, comes out with the next step's."""
    cfg = config(
        "marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2, "episode_len": 3},
        rollout_fragment_length=5, seed=3, batch_mode="complete_episodes",
        callbacks="tests.test_runner_flush:FailsFourthPostprocessing",
    )
    batches = []
    with EnvRunner(cfg) as runner:
        for _ in range(3):
            runner.step()
        with pytest.raises(RuntimeError, match="postprocessing broke"):
            runner.step()
        for _ in range(8):
            batches += [b for b in runner.step() if isinstance(b, MultiAgentBatch)]
        live_keys = sum(owner is not None for owner in runner._key_table.episode)
        running_slots = sum(len(e.slots) for e in runner._episodes.active.values())
    assert batches[0].policy_batches["shared"]["env_id"].tolist() == [0] * 6
    for batch in batches:
        check_batch_invariants(batch)
        assert batch.agent_steps() == 2 * batch.env_steps() == 2 * 3
    assert len(batches) == 1 + 2 * 2  # then the second and third episodes of both
    assert live_keys == running_slots
