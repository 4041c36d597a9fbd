"""EnvRunnerGroup on a real local Ray: parallel sampling, weights, filter merging, faults."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import torch

from marl_runner import SubEnvError
from marl_runner.checks import check_batch_invariants
from marl_runner.distributed import EnvRunnerGroup, EnvRunnerGroupError
from tests.runner_helpers import (
    FailsOnceAtThirdEpisodeEnd,
    FailsPostprocessingWhenTold,
    config,
)
from tests.test_ray_envs import check_complete_episodes, recorded_obs, timed_config

RUNNER_CPUS = 0.5  # two runners (and a restarted one) fit the fixture's 2 CPUs


def _group(cfg, num_runners: int = 2, **kwargs) -> EnvRunnerGroup:
    return EnvRunnerGroup(cfg, num_runners=num_runners, num_cpus_per_runner=RUNNER_CPUS, **kwargs)


def test_sample_gathers_every_runner_with_distinct_episodes(ray_local) -> None:
    cfg = timed_config(
        seed=5, batch_mode="truncate_episodes", rollout_fragment_length=8,
        env_config={"episode_len": 8},
    )
    with _group(cfg, local_runner=True) as group:
        batch = group.sample()
        metrics = group.get_metrics()
        # one policy for the whole group: every runner starts with the local runner's weights
        weights = group.foreach_runner(lambda runner: runner.get_weights())
        seeds = [group.runner_seed(0)] + [group.runner_seed(i, g) for i in (1, 2) for g in (0, 1, 2)]
    # sample(): one fragment per sub-env from each of the 2 remote runners
    assert batch.env_steps() == 2 * cfg.num_envs * cfg.rollout_fragment_length
    assert metrics["num_healthy_runners"] == 2 and metrics["num_runner_restarts"] == 0
    assert metrics["num_env_steps"] == batch.env_steps()
    shared = batch.policy_batches["shared"]
    # one whole episode per fragment; a seed shared by two runners would repeat eps_ids
    check_complete_episodes(batch, 8)
    assert len(np.unique(shared["eps_id"])) == 2 * cfg.num_envs
    assert len(set(seeds)) == len(seeds)
    for other in weights[1:]:
        for name, tensor in weights[0]["shared"].items():
            np.testing.assert_array_equal(np.asarray(tensor), np.asarray(other["shared"][name]))


def test_weights_set_on_the_driver_reach_every_runner(ray_local) -> None:
    with _group(timed_config(), local_runner=True) as group:
        local = group.local_runner.get_weights()["shared"]
        generator = torch.Generator().manual_seed(0)
        new = {
            "shared": {
                name: torch.randn(np.shape(value), generator=generator).numpy()
                for name, value in local.items()
            }
        }
        group.sync_weights(new)
        remote = group.foreach_runner(lambda runner: runner.get_weights(), local=False)
    assert len(remote) == 2
    for weights in remote:
        for name, value in new["shared"].items():
            np.testing.assert_allclose(np.asarray(weights["shared"][name]), value)


def test_policy_versions_count_the_weights_each_runner_was_given(ray_local) -> None:
    with _group(timed_config(), local_runner=True) as group:
        before = group.policy_versions()
        group.sync_weights(group.local_runner.get_weights())  # the local runner's set too
        group.sync_weights()  # the remote runners' only
        after = group.policy_versions()
        batch = group.sample()
    assert len(before) == len(after) == 3  # the local runner, then the 2 remote ones
    assert [a["shared"] - b["shared"] for a, b in zip(after, before)] == [1, 2, 2]
    # The remote runners sampled with the weights of their last version, and say so per row.
    assert set(batch.policy_batches["shared"]["policy_version"]) == {after[1]["shared"]}
    assert after[1] == after[2]


def test_merged_filter_statistics_equal_those_of_the_pooled_obs(ray_local) -> None:
    cfg = timed_config(
        env_config={"episode_len": 6},
        policies={
            "shared": {
                "model": {"type": "mlp", "hidden": [8]},
                "agent_connectors": [
                    "tests.test_ray_envs:ObsRecorder",
                    {"name": "MeanStdObservationFilterAgentConnector", "clip": None},
                ],
            }
        },
    )
    with _group(cfg) as group:
        for _ in range(2):  # a second round must not count the first one's obs again
            group.sample()
            merged = group.sync_connector_states()[("shared", 1)]
            pooled = np.concatenate(
                [seen["shared"] for seen in group.foreach_runner(recorded_obs)]
            ).astype(np.float64)
            assert merged["count"] == len(pooled)
            np.testing.assert_allclose(merged["mean"], pooled.mean(axis=0), rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(
                np.asarray(merged["m2"]) / merged["count"], pooled.var(axis=0), rtol=1e-9
            )
            installed = group.foreach_runner(
                lambda runner: runner.get_state()["shared"]["agent_connectors"][1][1]["state"]
            )
            for state in installed:
                assert state["count"] == merged["count"]
                np.testing.assert_array_equal(state["mean"], merged["mean"])


def test_killed_runner_is_restarted_and_no_data_is_lost_or_repeated(ray_local) -> None:
    episode_len = 5
    cfg = timed_config(seed=7, env_config={"episode_len": episode_len, "step_delay_s": 0.01})
    with _group(cfg, max_restarts=2) as group:
        new_weights = {
            "shared": {
                name: np.full(np.shape(value), 0.5, np.float32)
                for name, value in group.foreach_runner(lambda r: r.get_weights())[0]["shared"].items()
            }
        }
        group.sync_weights(new_weights)
        batches, killed = [], False
        for batch in group.iter_batches(num_batches=8, num_episodes=2):
            batches.append(batch)
            if not killed:  # runner 1 is busy with its next sample (or its first)
                ray_local.kill(group.remote_runners()[1], no_restart=True)
                killed = True
        metrics = group.get_metrics()
        after = group.sample(num_episodes=2)
        restarted_weights = group.foreach_runner(lambda r: r.get_weights())
        faults = list(group.faults)
        healthy = group.healthy_runner_ids()
    assert [fault.runner_id for fault in faults] == [1] and faults[0].restarted
    assert "RayActorError" in faults[0].error or "died" in faults[0].error
    assert metrics["num_runner_restarts"] == 1 and metrics["runner_faults"]
    assert healthy == [1, 2]
    seen: set[int] = set()
    for batch in [*batches, after]:
        ids = check_complete_episodes(batch, episode_len)
        assert not ids & seen, "an episode was handed out twice"
        seen |= ids
    # the restarted runner samples with the group's current weights
    for weights in restarted_weights:
        for name, value in new_weights["shared"].items():
            np.testing.assert_array_equal(np.asarray(weights["shared"][name]), value)


def test_runner_is_dropped_when_its_restarts_are_used_up(ray_local) -> None:
    with _group(timed_config(env_config={"episode_len": 4}), max_restarts=0) as group:
        ray_local.kill(group.remote_runners()[2], no_restart=True)
        batch = group.sample(num_episodes=1)
        assert group.healthy_runner_ids() == [1]
        assert not group.faults[0].restarted
        check_complete_episodes(batch, 4)
        ray_local.kill(group.remote_runners()[1], no_restart=True)
        with pytest.raises(EnvRunnerGroupError, match="runner 1 .*died"):
            group.sample()
        # with every runner dropped, later calls say so too (not a missing local runner)
        with pytest.raises(EnvRunnerGroupError, match="no healthy runners left"):
            group.sample()
        with pytest.raises(EnvRunnerGroupError, match="no healthy runners left"):
            next(group.iter_batches(num_batches=1))


def _free_cpus_settle(ray, expected: float) -> float:
    """Free CPUs once they reach `expected` (killed actors release theirs a moment later)."""
    deadline = time.monotonic() + 15
    while ray.available_resources().get("CPU", 0) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return ray.available_resources().get("CPU", 0)


def test_stop_leaves_no_runner_actors(ray_local) -> None:
    total = ray_local.cluster_resources()["CPU"]
    assert _free_cpus_settle(ray_local, total) == total  # earlier tests left nothing either
    group = _group(timed_config(vectorize="ray", remote_env_num_cpus=0.25), num_runners=1)
    group.sample()
    # the runner and its 2 sub-env actors
    assert np.isclose(total - ray_local.available_resources().get("CPU", 0), 0.5 + 2 * 0.25)
    actor = group.remote_runners()[1]
    group.stop()
    assert _free_cpus_settle(ray_local, total) == total
    with pytest.raises(ray_local.exceptions.RayActorError):
        ray_local.get(actor.ready.remote(), timeout=10)


def test_group_without_remote_runners_samples_locally() -> None:
    """No Ray needed: `num_runners=0` is one local runner, as `--runners 0` uses it."""
    with EnvRunnerGroup(timed_config(env_config={"episode_len": 4}), num_runners=0) as group:
        batches = list(group.iter_batches(num_batches=2))
        metrics = group.get_metrics()
    assert len(batches) == 2
    assert metrics["num_healthy_runners"] == 1
    assert metrics["num_env_steps"] == sum(batch.env_steps() for batch in batches)
    for batch in batches:
        check_complete_episodes(batch, 4)


def test_flush_hands_out_the_samples_still_running(ray_local) -> None:
    """The end of a run: a remote sample still running when the caller stops taking
    batches is waited for and handed out, with its episodes; a second flush has nothing."""
    cfg = timed_config(
        seed=3, batch_mode="truncate_episodes", rollout_fragment_length=8,
        env_config={"episode_len": 5},
    )
    with _group(cfg) as group:
        first = next(group.iter_batches(num_batches=1))  # the other runner's sample runs on
        rest = group.flush()
        again = group.flush()
        metrics = group.get_metrics()
    batches = [first, rest]
    assert [b.env_steps() for b in batches] == [cfg.num_envs * 8] * 2
    for batch in batches:
        check_batch_invariants(batch)
    shared = [b.policy_batches["shared"] for b in batches]
    ended = sum(len(np.unique(pb["eps_id"][pb["terminateds"] | pb["truncateds"]])) for pb in shared)
    assert ended == metrics["episodes"] > 0  # every episode the runners finished is out
    assert metrics["num_env_steps"] == sum(b.env_steps() for b in batches)
    assert again.env_steps() == 0 and again.agent_steps() == 0


def test_a_runner_whose_sample_raises_hands_over_its_finished_episodes(
    ray_local, tmp_path
) -> None:
    """Fragments of 40 steps, episodes of 5: when a runner's third episode end raises,
    its first two episodes (and its other sub-env's) are unbuilt. The runner hands them
    over before it is replaced: they come out whole in the group's batches, counted in
    its metrics, and the restarted runner samples on."""
    episode_len = 5
    cfg = timed_config(
        seed=11, batch_mode="truncate_episodes", rollout_fragment_length=40,
        env_config={"episode_len": episode_len},
    )
    callbacks = FailsOnceAtThirdEpisodeEnd(str(tmp_path / "token"))
    with _group(cfg, max_restarts=1, callbacks=callbacks) as group:
        batch = group.sample()
        rest = group.flush()
        metrics = group.get_metrics()
        faults = list(group.faults)
        healthy = group.healthy_runner_ids()
    assert len(faults) == 1 and "on_episode_end broke" in faults[0].error and faults[0].restarted
    assert healthy == [1, 2]
    assert "it handed over 10 env steps first" in faults[0].error
    check_batch_invariants(batch)
    shared = batch.policy_batches["shared"]
    finals = shared["terminateds"] | shared["truncateds"]
    assert np.all(shared["t"][finals] == episode_len - 1)  # each one whole
    # Two runners' fragments (2 sub-envs x 40 steps each: 8 episodes per sub-env), and
    # the failed runner's first episode on each sub-env (its second broke, or was running).
    assert batch.env_steps() == 2 * 2 * 40 + 2 * episode_len
    assert len(np.unique(shared["eps_id"][finals])) == metrics["episodes"] == 2 * 2 * 8 + 2
    assert metrics["num_faulty_episodes"] == 1
    # The steps of the two dropped episodes were sampled too (metrics count them).
    assert metrics["num_env_steps"] == batch.env_steps() + 2 * episode_len
    assert rest.env_steps() == 0


def test_a_sub_env_crash_with_restarts_off_restarts_its_runner(ray_local, tmp_path) -> None:
    """The default (restarts off): one sub-env of one runner crashes, so that runner's
    sample raises SubEnvError. It reaches the driver whole (it used to arrive as Ray's
    UnserializableException, which the group did not handle), and the runner is
    replaced like any runner whose sample raised."""
    cfg = config(
        "tests.envs:CrashingEnv", num_envs=2, seed=1, restart_failed_sub_environments=False,
        env_config={"crash_step": 3, "episode_len": 10, "fault_token": str(tmp_path / "token")},
    )
    with _group(cfg, max_restarts=1) as group:
        batch = group.sample()
        faults = list(group.faults)
        healthy = group.healthy_runner_ids()
    assert len(faults) == 1 and faults[0].restarted, faults
    assert "its sample raised SubEnvError: sub-env" in faults[0].error
    assert "restart_failed_sub_environments is off" in faults[0].error
    assert healthy == [1, 2]
    check_batch_invariants(batch)


def test_sub_env_errors_pickle_whole() -> None:
    """Also with a cause that does not pickle (its traceback stays in the message)."""

    class TwoArguments(Exception):
        def __init__(self, first: int, second: int) -> None:
            super().__init__(first)

    for cause in (ValueError("bad obs"), TwoArguments(1, 2), None):
        error = SubEnvError(3, "failed", cause)
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), copy.env_id, str(copy)) == (SubEnvError, 3, str(error))
    assert repr(pickle.loads(pickle.dumps(SubEnvError(0, "m", ValueError("x")))).__cause__) == (
        "ValueError('x')"
    )


def test_a_flush_that_raises_in_one_runner_keeps_the_others(ray_local) -> None:
    """The end of a run: runner 2's post-processing raises in its flush. Runner 1's rows
    since its last fragment still come out, and runner 2 is replaced (a fault) rather
    than the error ending the flush with every runner's data."""
    cfg = timed_config(
        seed=3, batch_mode="truncate_episodes", rollout_fragment_length=8,
        env_config={"episode_len": 5},
    )
    with _group(cfg, max_restarts=1, callbacks=FailsPostprocessingWhenTold()) as group:
        group.sample()
        group.foreach_runner(lambda runner: [runner.step() for _ in range(3)])
        ray_local.get(
            group.remote_runners()[2].apply.remote(
                lambda runner: setattr(runner.callbacks, "failing", True)
            )
        )
        rest = group.flush()
        faults = list(group.faults)
        healthy = group.healthy_runner_ids()
    check_batch_invariants(rest)
    # Runner 1's three rounds on its 2 sub-envs.
    assert rest.env_steps() == 2 * 3
    assert set(rest.policy_batches["shared"]["env_id"].tolist()) == {0, 1}
    assert [fault.runner_id for fault in faults] == [2] and faults[0].restarted
    assert "its flush raised RuntimeError: postprocessing broke" in faults[0].error
    assert healthy == [1, 2]
