"""Send before store, adversarially: a runner step that raises (or is interrupted) after
its actions were sent and before or while its rows are stored, in every backend. The
round's sub-envs lose their episode (faulty, no training data), nothing built is lost or
repeated, and no stale step result is ever handed out as a new episode's step."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest

from connectors import AgentConnector
from connectors.data import AgentRows
from marl_runner import Callbacks, EnvRunner, MultiAgentBatch
from marl_runner.checks import trajectory_rows
from marl_runner.sampling.fragments import FragmentBuilder
from tests.envs import CheapEnv
from tests.runner_helpers import config
from tests.test_runner_faults import assert_nothing_lost_or_repeated
from tests.test_runner_flush import step_into_a_broken_round

EPISODE_LEN = 7
COUNTING = "tests.test_runner_send_before_store:CountingEnv"


class CountingEnv(CheapEnv):
    """CheapEnv (obs column 0 is ``t / episode_len``: a new episode starts at 0) whose
    steps sleep ``slow_delay_s`` in the sub-env first seeded ``slow_seed`` (sub-env i is
    first seeded ``seed + i``), so its step is still in flight when the others reply;
    with ``slow_first_step``, only the first step of its first episode."""

    def __init__(
        self, num_agents: int = 2, episode_len: int = EPISODE_LEN, slow_seed: int | None = None,
        slow_delay_s: float = 0.0, slow_first_step: bool = False,
    ) -> None:
        super().__init__(num_agents=num_agents, episode_len=episode_len)
        self.slow_seed, self.slow_delay_s = slow_seed, slow_delay_s
        self.slow_first_step = slow_first_step
        self.slow, self.resets = False, 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        if self.resets == 0:
            self.slow = seed is not None and seed == self.slow_seed
        self.resets += 1
        return super().reset(seed=seed, options=options)

    def step(self, actions: dict) -> tuple:
        if self.slow and (not self.slow_first_step or (self.resets, self._t) == (1, 0)):
            time.sleep(self.slow_delay_s)
        return super().step(actions)


class _ColumnMisshapenOnCalls(AgentConnector):
    """Adds a column the store keeps, two values wide on the calls in ``numbers``: storing
    those rounds' rows raises (a ValueError), after their actions were sent."""

    def __init__(self, ctx: Any, numbers: set[int]) -> None:
        super().__init__(ctx)
        self.numbers, self.calls = numbers, 0

    def __call__(self, rows: AgentRows) -> AgentRows:
        self.calls += 1
        width = (2,) if self.calls in self.numbers else ()
        rows["extra"] = np.zeros((len(rows), *width), np.float32)
        return rows


BACKENDS = {
    "sync": {"vectorize": "sync"},
    "subprocess": {"vectorize": "subprocess"},
    "async_pool": {"vectorize": "subprocess", "num_envs_per_poll": 1},
    "async_poll": {"vectorize": "subprocess", "async_poll": True},
}


def _config(backend: dict, num_envs: int = 3, slow: bool = False, **more: Any) -> Any:
    env_config = {"num_agents": 2, "episode_len": EPISODE_LEN}
    if slow:  # the last sub-env steps slowly: its step is in flight when the others reply
        env_config.update(slow_seed=num_envs - 1, slow_delay_s=0.02)
    return config(
        COUNTING, num_envs=num_envs, seed=0, rollout_fragment_length=4,
        env_config=env_config, **backend, **more,
    )


def assert_steps_count_from_reset(batches: list[MultiAgentBatch]) -> None:
    """Every row's obs is the env's step count within its episode: a stale step result
    handed out as a new episode's step would start a trajectory past 0."""
    for batch in batches:
        for policy_batch in batch.policy_batches.values():
            env_t = np.rint(policy_batch["obs"][:, 0] * EPISODE_LEN).astype(np.int64)
            np.testing.assert_array_equal(env_t, policy_batch["t"])
            new_t = np.rint(policy_batch["new_obs"][:, 0] * EPISODE_LEN).astype(np.int64)
            np.testing.assert_array_equal(new_t, policy_batch["t"] + 1)


def assert_trajectories_whole(batches: list[MultiAgentBatch]) -> None:
    """Over all batches of a runner, each trajectory's rows are t = 0, 1, ... with none
    missing: every episode starts after the runner was built, and a dropped episode
    leaves no rows at all, so a trajectory missing its first rows lost an agent step."""
    times: dict[tuple[int, int], list[int]] = {}
    for batch in batches:
        for policy_batch in batch.policy_batches.values():
            for key, rows in trajectory_rows(policy_batch).items():
                times.setdefault(key, []).extend(policy_batch["t"][rows].tolist())
    for key, ts in times.items():
        assert sorted(ts) == list(range(len(ts))), f"trajectory {key}: t {sorted(ts)}"


def assert_processes_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # A zombie the vector env did not reap is still "there" to kill(pid, 0).
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ", 1)[1].startswith("Z"):
                    break
            assert time.monotonic() < deadline, f"worker process {pid} still runs after stop()"
            time.sleep(0.05)


def _sample_after_faults(
    runner: EnvRunner, raises: type[BaseException], faults: int = 1, more: int = 3
) -> list[MultiAgentBatch]:
    """Samples until the fault has raised ``faults`` times, then ``more`` times: every
    batch handed out."""
    batches: list[MultiAgentBatch] = []
    raised = 0
    for _ in range(100):
        try:
            batches.append(runner.sample(num_env_steps=12))
        except raises:
            raised += 1
            if raised == faults:
                break
    assert raised == faults
    return batches + [runner.sample(num_env_steps=24) for _ in range(more)]


def _check(batches: list[MultiAgentBatch]) -> None:
    assert_nothing_lost_or_repeated(batches)
    assert_steps_count_from_reset(batches)
    assert_trajectories_whole(batches)
    for batch in batches:
        for policy_batch in batch.policy_batches.values():
            extra = policy_batch.get("extra")
            assert extra is None or extra.shape[1:] == ()


def _worker_pids(runner: EnvRunner) -> list[int]:
    return list(getattr(runner.env, "worker_pids", []))


# ---- one failing store, every backend


@pytest.mark.parametrize("backend", BACKENDS, ids=list(BACKENDS))
def test_a_store_error_after_the_send_drops_that_rounds_sub_envs(backend: str) -> None:
    cfg = _config(BACKENDS[backend], slow=backend.startswith("async"))
    with EnvRunner(cfg) as runner:
        pipeline = runner.policy_map.entries["shared"].agent_pipeline
        connector = _ColumnMisshapenOnCalls(pipeline.ctx, {9})
        pipeline.append(connector)
        polled_in_failing_round: list[int] = []
        poll = runner._poll

        def recording_poll() -> Any:
            polled = poll()
            if connector.calls == 8:
                polled_in_failing_round.extend(polled.obs)
            return polled

        runner._poll = recording_poll
        batches = _sample_after_faults(runner, ValueError)
        metrics = runner.get_metrics()
        pids = _worker_pids(runner)
    assert metrics["num_faulty_episodes"] == len(polled_in_failing_round) >= 1
    _check(batches)
    assert_processes_gone(pids)


# ---- two failing stores in a row


@pytest.mark.parametrize("backend", BACKENDS, ids=list(BACKENDS))
def test_two_store_errors_in_a_row_leave_no_sub_env_half_stepped(backend: str) -> None:
    """The round after a failed one resets the dropped sub-envs and sends their first
    actions; when it fails too, those sub-envs' new episodes must go as well, polled in
    that round or not (an async pool may reset one whose step is still in flight)."""
    cfg = _config(BACKENDS[backend], slow=backend.startswith("async"))
    with EnvRunner(cfg) as runner:
        pipeline = runner.policy_map.entries["shared"].agent_pipeline
        pipeline.append(_ColumnMisshapenOnCalls(pipeline.ctx, {9, 10}))
        batches = _sample_after_faults(runner, ValueError, faults=2)
        pids = _worker_pids(runner)
    _check(batches)
    assert_processes_gone(pids)


class _RaisingThenMisshapen(AgentConnector):
    """Raises (a RuntimeError, before the send) on the calls in ``raising``, misshapes the
    stored column on the calls in ``misshapen`` (a ValueError in the store, after it)."""

    def __init__(self, ctx: Any, raising: set[int], misshapen: set[int]) -> None:
        super().__init__(ctx)
        self.raising, self.misshapen, self.calls = raising, misshapen, 0

    def __call__(self, rows: AgentRows) -> AgentRows:
        self.calls += 1
        if self.calls in self.raising:
            raise RuntimeError(f"connector failure on call {self.calls}")
        width = (2,) if self.calls in self.misshapen else ()
        rows["extra"] = np.zeros((len(rows), *width), np.float32)
        return rows


def _store_raising(
    runner: EnvRunner, calls: set[int], error: type[BaseException] = ValueError,
    after_storing: bool = False,
) -> None:
    """The runner's store raises ``error`` on the calls in ``calls``: before storing
    anything, or after storing the round's rows (``after_storing``)."""
    store, count = runner._store, [0]

    def raising(*args: Any) -> None:
        count[0] += 1
        if count[0] in calls and not after_storing:
            raise error(f"store failure on call {count[0]}")
        store(*args)
        if count[0] in calls:
            raise error(f"store failure after call {count[0]} stored")

    runner._store = raising


def _polled_in_steps(runner: EnvRunner, steps: set[int]) -> list[int]:
    """The sub-envs the runner's polls numbered ``steps`` (from 1, from now on) hand out,
    filled in as it samples."""
    polled_there: list[int] = []
    poll, count = runner._poll, [0]

    def recording_poll() -> Any:
        count[0] += 1
        polled = poll()
        if count[0] in steps:
            polled_there.extend(polled.obs)
        return polled

    runner._poll = recording_poll
    return polled_there


def _polls_of_each_sub_env(runner: EnvRunner, steps: int) -> dict[int, int]:
    """Steps the runner ``steps`` times (a bounded loop, where sample() could wait
    forever): how many of its polls each sub-env was in."""
    seen = dict.fromkeys(range(runner.config.num_envs), 0)
    poll = runner._poll

    def counting_poll() -> Any:
        polled = poll()
        for env_id in polled.obs:
            seen[env_id] += 1
        return polled

    runner._poll = counting_poll
    for _ in range(steps):
        runner.step()
    runner._poll = poll
    return seen


# A sub-env reset in a step that then raised was not unfinished (only polled ones were):
# the three tests below failed before `_reset_sub_env` marked it so.


@pytest.mark.parametrize("backend", ["sync", "subprocess"])
def test_two_connector_errors_in_a_row_leave_every_sub_env_stepping(backend: str) -> None:
    """Step A raises before the send; step B resets A's sub-envs (no step of theirs to
    poll: none was sent) and raises before the send too. Sampling must go on in every
    sub-env (sample() would wait forever for the others; this steps a bounded number of
    times instead)."""
    cfg = _config(BACKENDS[backend])
    with EnvRunner(cfg) as runner:
        pipeline = runner.policy_map.entries["shared"].agent_pipeline
        pipeline.append(_RaisingThenMisshapen(pipeline.ctx, {5, 6}, set()))
        for _ in range(2):
            with pytest.raises(RuntimeError, match="connector failure"):
                for _ in range(10):
                    runner.step()
        seen = _polls_of_each_sub_env(runner, 30)
    assert all(seen.values()), f"polls per sub-env after the faults: {seen}"


@pytest.mark.parametrize("backend", ["sync", "subprocess"])
def test_a_store_error_in_the_step_after_a_connector_error_drops_the_reset_episodes(
    backend: str,
) -> None:
    """Step A raises before the send; step B resets A's sub-envs (none of them polled),
    sends their first actions and its store raises. Their new episodes must be dropped,
    not go on missing their first rows."""
    cfg = _config(BACKENDS[backend])
    with EnvRunner(cfg) as runner:
        pipeline = runner.policy_map.entries["shared"].agent_pipeline
        connector = _RaisingThenMisshapen(pipeline.ctx, {5}, {6})
        pipeline.append(connector)
        batches = _sample_after_faults(runner, (RuntimeError, ValueError), faults=2)
        metrics = runner.get_metrics()
    _check(batches)
    assert metrics["num_faulty_episodes"] == 6  # every sub-env in both steps


def test_a_reset_sub_env_not_polled_in_a_failing_round_loses_its_new_episode() -> None:
    """Async pool: step A (the first, every sub-env's reset obs) fails in the store after
    the send; sub-env 2's first step takes a second. Step B polls only sub-envs 0 and 1,
    resets all three (2 after its step reply), sends their first actions and fails in the
    store too: sub-env 2's new episode must be dropped with the others."""
    cfg = _config(BACKENDS["async_pool"], slow=True, num_workers=3)
    cfg.env["config"].update(slow_delay_s=1.0, slow_first_step=True)
    with EnvRunner(cfg) as runner:
        _store_raising(runner, {1, 2})
        batches = _sample_after_faults(runner, ValueError, faults=2)
        metrics = runner.get_metrics()
        pids = _worker_pids(runner)
    _check(batches)
    assert metrics["num_faulty_episodes"] == 6  # every sub-env in both steps
    assert_processes_gone(pids)


# ---- interrupted inside the store


@pytest.mark.parametrize("backend", BACKENDS, ids=list(BACKENDS))
@pytest.mark.parametrize("after_storing", [False, True], ids=["before_storing", "after_storing"])
def test_a_keyboard_interrupt_in_the_store_drops_that_rounds_sub_envs(
    backend: str, after_storing: bool
) -> None:
    """Interrupted before the rows are stored, or once they are (the step still did not
    finish: the round's episodes go, their stored rows with them)."""
    cfg = _config(BACKENDS[backend], slow=backend.startswith("async"))
    with EnvRunner(cfg) as runner:
        polled_in_failing_round = _polled_in_steps(runner, {9})
        _store_raising(runner, {9}, KeyboardInterrupt, after_storing)
        batches = _sample_after_faults(runner, KeyboardInterrupt)
        metrics = runner.get_metrics()
        pids = _worker_pids(runner)
    assert metrics["num_faulty_episodes"] == len(polled_in_failing_round) >= 1
    _check(batches)
    assert_processes_gone(pids)


def test_fragment_builder_add_rows_raising_once_loses_nothing_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trajectory store itself raises (after keeping the rows) in the middle of a
    sample, with two policies: the other policy's rows of the round go with the round."""
    add_rows, calls = FragmentBuilder.add_rows, [0]

    def raising(self: FragmentBuilder, *args: Any) -> None:
        add_rows(self, *args)
        calls[0] += 1
        if calls[0] == 13:
            raise OSError("store full")

    monkeypatch.setattr(FragmentBuilder, "add_rows", raising)
    cfg = _config(
        BACKENDS["subprocess"],
        policies={"p0": {"model": {"type": "mlp", "hidden": [8]}},
                  "p1": {"model": {"type": "mlp", "hidden": [8]}}},
        policy_mapping_fn={"agent_0": "p0", "agent_1": "p1"},
    )
    with EnvRunner(cfg) as runner:
        batches = _sample_after_faults(runner, OSError)
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == 3
    _check(batches)


# ---- Ray


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_a_store_error_after_the_send_with_ray_sub_envs(ray_local: Any, error: type) -> None:
    """Real local Ray, one slow sub-env: its step may be in flight when the store raises;
    its result must not pass for the new episode's first step (`_forget_requests`)."""
    cfg = _config(
        {"vectorize": "ray", "remote_env_num_cpus": 0.25, "remote_env_batch_wait_ms": 1},
        slow=True,
    )
    with EnvRunner(cfg) as runner:
        polled_in_failing_round = _polled_in_steps(runner, {9, 10})
        _store_raising(runner, {9, 10}, error)
        batches = _sample_after_faults(runner, error, faults=2)
        metrics = runner.get_metrics()
        actors = runner.env.actors
    assert metrics["num_faulty_episodes"] >= len(set(polled_in_failing_round)) >= 1
    _check(batches)
    assert_actor_gone(ray_local, actors[0])


def assert_actor_gone(ray: Any, actor: Any) -> None:
    """``ray.kill`` takes effect a moment later: a call made at once may still be served."""
    deadline = time.monotonic() + 15
    while True:
        try:
            ray.get(actor.spaces.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, "a sub-env actor still answers 15 s after stop()"
        time.sleep(0.05)


# ---- try_reset's dropping leaves what is legitimately pending


@pytest.mark.parametrize("backend", ["async_pool", "async_poll"])
def test_async_pools_without_faults_keep_every_sub_env_playing_whole_episodes(
    backend: str,
) -> None:
    """Resets of episodes that ended (prefetched with the last step) while other workers'
    steps are in flight: no result a poll should hand out is dropped (each sub-env keeps
    playing, whole episodes from t=0), nothing is faulty."""
    cfg = _config(BACKENDS[backend], num_envs=4, slow=True, num_workers=2)
    batches: list[MultiAgentBatch] = []
    with EnvRunner(cfg) as runner:
        played: set[int] = set()
        for _ in range(200):  # until every sub-env's episodes reach a batch (bounded)
            batches.append(runner.sample(num_env_steps=20))
            played.update(
                int(env_id) for pb in batches[-1].policy_batches.values()
                for env_id in np.unique(pb["env_id"][pb["truncateds"]])
            )
            if len(played) == 4:
                break
        metrics = runner.get_metrics()
    assert played == {0, 1, 2, 3}, f"sub-envs that finished an episode: {played}"
    assert metrics["num_faulty_episodes"] == 0
    _check(batches)


def test_an_async_pool_restarting_crashed_sub_envs_keeps_invariants() -> None:
    """Crashed sub-envs restarted (their reset after a restart) beside in-flight steps."""
    cfg = config(
        "tests.envs:CrashingEnv", num_envs=4, vectorize="subprocess",
        num_envs_per_poll=2, num_workers=2, restart_failed_sub_environments=True,
        rollout_fragment_length=4,
        max_consecutive_step_failures=1000, env_config={"crash_step": 5, "episode_len": 8},
    )
    with EnvRunner(cfg) as runner:
        batches = [runner.sample(num_env_steps=40) for _ in range(2)]
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] >= 1 and metrics["num_sub_env_restarts"] >= 1
    assert_nothing_lost_or_repeated(batches)
    assert_trajectories_whole(batches)


class _StepBreaksWhenArmed(Callbacks):
    """``on_episode_step`` raises once, when ``armed``."""

    armed = False

    def on_episode_step(self, **kwargs: Any) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("on_episode_step broke")


def test_a_step_that_raises_before_its_resets_leaves_them_for_the_next() -> None:
    """(Found in review.) Sub-env 0 steps slowly, so an async pool polls sub-env 1 alone:
    the round that raises has only sub-env 1, which is then to be reset. The next step
    polls sub-env 0, whose ``on_episode_step`` raises before that reset: sub-env 1 must be
    reset in a later step all the same, and ``sample()`` must come back with both
    (before, sub-env 1 was never reset nor polled again, and it never did)."""
    cfg = config(
        COUNTING, num_envs=2, seed=0, rollout_fragment_length=4,
        env_config={"num_agents": 2, "episode_len": EPISODE_LEN, "slow_seed": 0, "slow_delay_s": 0.1},
        vectorize="subprocess", num_envs_per_poll=1, num_workers=2,
    )
    with EnvRunner(cfg, callbacks=_StepBreaksWhenArmed()) as runner:
        step_into_a_broken_round(runner, 3)
        runner.callbacks.armed = True
        with pytest.raises(RuntimeError, match="on_episode_step broke"):
            runner.step()
        batch = runner.sample()  # waits for both sub-envs' fragments
    assert set(batch.policy_batches["shared"]["env_id"].tolist()) == {0, 1}
    _check([batch])
