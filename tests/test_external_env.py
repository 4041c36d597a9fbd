"""`vectorize: external`: episodes driven by client threads, served by the runner."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from marl_runner import EnvRunner, MultiAgentBatch, RunnerConfig
from marl_runner.checks import check_batch_invariants, rewards_per_trajectory, trajectory_rows
from marl_runner.envs import EnvError, ExternalMultiAgentEnv
from marl_runner.envs.external_episodes import ExternalEnvStopped

THREADED = "marl_runner.bench.envs.external_envs:ThreadedExternalEnv"
PLAIN = "tests.test_external_env:TwoAgentExternalEnv"


class TwoAgentExternalEnv(ExternalMultiAgentEnv):
    """Two agents, Box(3) obs, Discrete(4) actions; the test drives the calls itself."""

    def __init__(self) -> None:
        import gymnasium as gym

        space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        super().__init__({"a0": space, "a1": space}, dict.fromkeys(("a0", "a1"), gym.spaces.Discrete(4)))


class FailingRunEnv(TwoAgentExternalEnv):
    def run(self) -> None:
        raise RuntimeError("simulator lost its license")


def external_config(env: dict[str, Any], **overrides: Any) -> RunnerConfig:
    policy: dict[str, Any] = {"model": {"type": "mlp", "hidden": [8]}}
    policy.update(overrides.pop("policy", {}))
    return RunnerConfig.from_dict(
        {
            "env": env,
            "vectorize": "external",
            "num_envs": 4,
            "batch_mode": "complete_episodes",
            "policies": {"p": policy},
            **overrides,
        }
    )


def threaded(**config: Any) -> dict[str, Any]:
    return {"name": THREADED, "config": config}


def count_forward_passes(runner: EnvRunner) -> dict[str, int]:
    counts = {"calls": 0}
    policy = runner.policy_map["p"]
    forward = policy.compute_actions_from_input_dict

    def counting(input_dict: Any, **kwargs: Any) -> Any:
        counts["calls"] += 1
        return forward(input_dict, **kwargs)

    policy.compute_actions_from_input_dict = counting
    return counts


def step_until(runner: EnvRunner, done: Callable[[], bool], timeout_s: float = 30.0) -> list:
    """Steps the runner until `done()`, then a few more rounds; returns the batches."""
    batches = []
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "external clients did not finish in time"
        batches += [o for o in runner.step() if isinstance(o, MultiAgentBatch)]
    for _ in range(3):
        batches += [o for o in runner.step() if isinstance(o, MultiAgentBatch)]
    return batches


def per_episode_totals(batches: list[MultiAgentBatch]) -> list[float]:
    return sorted(round(v, 5) for b in batches for v in rewards_per_trajectory(b).values())


def played_totals(env: Any) -> list[float]:
    return sorted(round(v, 5) for e in env.played for v in e.rewards.values())


@pytest.mark.parametrize("num_threads", [1, 4, 16])
def test_client_threads_rewards_conserved_and_forward_passes_batched(num_threads):
    cfg = external_config(
        threaded(num_threads=num_threads, episodes_per_thread=3, num_agents=3,
                 late_join=True, leave=True),
        num_envs=num_threads,
    )
    with EnvRunner(cfg) as runner:
        counts = count_forward_passes(runner)
        env = runner.env.get_sub_environments()[0]
        batches = step_until(runner, env.done)
        metrics = runner.get_metrics()
    assert not env.errors
    assert len(env.played) == num_threads * 3 == len(batches) == metrics["episodes"]
    assert metrics["num_faulty_episodes"] == 0
    for batch in batches:
        check_batch_invariants(batch)
        assert batch.env_steps() == env.episode_len  # one env step per get_action/log_action round
    # Every reward a client logged sits in the batches, per episode and agent (late joiner
    # and the agent that left included).
    assert per_episode_totals(batches) == played_totals(env)
    requests = sum(e.requests for e in env.played)
    if num_threads == 1:
        assert counts["calls"] == requests
    else:
        assert counts["calls"] < requests


def test_agents_joining_late_and_leaving_follow_the_spec():
    cfg = external_config(threaded(num_threads=2, episodes_per_thread=2, num_agents=3,
                                   late_join=True, leave=True, episode_len=6))
    with EnvRunner(cfg) as runner:
        env = runner.env.get_sub_environments()[0]
        batches = step_until(runner, env.done)
    for batch in batches:
        policy_batch = batch.policy_batches["p"]
        lengths = {}
        for (_, agent_index), rows in trajectory_rows(policy_batch).items():
            lengths[agent_index] = len(rows)
            last = rows[-1]
            assert policy_batch["terminateds"][last]  # closed at the episode end
        # a0 acts 6 times; a1 acts at t=0..2 and gets a fake final obs; a2 joins at t=2.
        assert sorted(lengths.values()) == [3, 4, 6]
        fake_rows = [rows[-1] for rows in trajectory_rows(policy_batch).values() if len(rows) == 3]
        np.testing.assert_array_equal(policy_batch["new_obs"][fake_rows[0]], np.zeros(3, np.float32))
    assert per_episode_totals(batches) == played_totals(env)


def test_off_policy_actions_are_stored():
    cfg = external_config(threaded(num_threads=3, episodes_per_thread=2, num_agents=2,
                                   off_policy_every=2, episode_len=6))
    with EnvRunner(cfg) as runner:
        env = runner.env.get_sub_environments()[0]
        batches = step_until(runner, env.done)
    logged = 0
    for batch in batches:
        policy_batch = batch.policy_batches["p"]
        for rows in trajectory_rows(policy_batch).values():
            t, actions = policy_batch["t"][rows], policy_batch["actions"][rows]
            assert (actions[t % 2 == 1] == 3).all()  # the logged action, not the policy's
            logged += int((t % 2 == 1).sum())
    assert logged == sum(len(e.logged_actions) for e in env.played) > 0
    assert per_episode_totals(batches) == played_totals(env)
    # Each row's action_logp is its stored action's, logged or not: what a trainer's
    # evaluate() gives (the policy's own action's log-prob stood there before).
    policy = runner.policy_map["p"]
    for batch in batches:
        policy_batch = batch.policy_batches["p"]
        logp, _, _ = policy.evaluate(policy_batch)
        np.testing.assert_allclose(policy_batch["action_logp"], logp.detach().numpy(), atol=1e-5)


@pytest.mark.parametrize("action", [4, -1, "x", 10**30, 1.5, None])
def test_a_logged_action_outside_the_agents_action_space_is_refused_by_name(action):
    with EnvRunner(external_config({"name": PLAIN})) as runner:
        env = runner.env.get_sub_environments()[0]
        episode = env.start_episode()
        obs = {"a0": np.zeros(3, np.float32), "a1": np.zeros(3, np.float32)}
        with pytest.raises(ValueError, match=r"agent 'a1'.s action .* is not in its action space"):
            env.log_action(episode, obs, {"a0": 1, "a1": action})


def test_connectors_run_under_external_control():
    agent_chain = [
        "ObsPreprocessorConnector",
        "MeanStdObservationFilterAgentConnector",
        "ViewRequirementAgentConnector",
    ]
    frames = 3
    cfg = external_config(
        threaded(num_threads=4, episodes_per_thread=3, obs_dim=3, episode_len=6),
        policy={"agent_connectors": agent_chain,
                "config": {"view_requirements": {"obs": {"frames": frames}}}},
    )
    with EnvRunner(cfg) as runner:
        env = runner.env.get_sub_environments()[0]
        batches = step_until(runner, env.done)
        filter_state = dict(runner.get_state()["p"]["agent_connectors"])[agent_chain[1]]["state"]
    assert not env.errors
    obs_rows = 0
    for batch in batches:
        check_batch_invariants(batch)
        policy_batch = batch.policy_batches["p"]
        assert policy_batch["obs"].shape[1:] == (frames, 3)
        for rows in trajectory_rows(policy_batch).values():
            obs_rows += len(rows) + 1  # and the final (or fake final) obs of the trajectory
            first = policy_batch["obs"][rows[0]]
            assert (first[:-1] == 0).all() and first[-1].any()  # padded at the episode start
            np.testing.assert_array_equal(policy_batch["obs"][rows[1]][-2], first[-1])
    # The filter saw every obs of every trajectory, and normalised them:
    # raw uniform(-1, 1) obs have std 0.58, filtered ones about 1.
    assert filter_state["count"] == obs_rows
    last_frames = np.concatenate([b.policy_batches["p"]["obs"][:, -1] for b in batches])
    assert 0.8 < last_frames.std() < 1.2
    assert per_episode_totals(batches) == played_totals(env)


def test_truncated_end_sets_truncated_flags():
    with EnvRunner(external_config({"name": PLAIN}, num_envs=1)) as runner:
        env = runner.env.get_sub_environments()[0]
        result: dict[str, Any] = {}

        def client() -> None:
            eid = env.start_episode()
            env.get_action(eid, {"a0": np.zeros(3, np.float32)})
            env.log_returns(eid, {"a0": 1.5})
            env.end_episode(eid, {"a0": np.ones(3, np.float32)}, truncated=True)
            result["done"] = True

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        batches = step_until(runner, lambda: "done" in result)
    (batch,) = batches
    policy_batch = batch.policy_batches["p"]
    assert policy_batch["truncateds"].tolist() == [True]
    assert policy_batch["terminateds"].tolist() == [False]
    assert policy_batch["rewards"].tolist() == [1.5]


def test_unknown_and_finished_episode_ids_raise_value_error():
    with EnvRunner(external_config({"name": PLAIN}, num_envs=1)) as runner:
        env = runner.env.get_sub_environments()[0]
        with pytest.raises(ValueError, match="unknown episode 'nope'"):
            env.get_action("nope", {"a0": np.zeros(3, np.float32)})
        eid = env.start_episode("mine")
        env.end_episode(eid, {})  # never stepped: nothing for the runner, the slot is free again
        for call in (
            lambda: env.log_returns("mine", {"a0": 1.0}),
            lambda: env.get_action("mine", {"a0": np.zeros(3, np.float32)}),
            lambda: env.start_episode("mine"),
        ):
            with pytest.raises(ValueError, match="'mine' has already finished"):
                call()
        assert env.start_episode() != eid  # the freed slot takes the next episode at once
        for odd in ("lots", "5", True, np.bool_(True), b"5"):  # float() took "5" and True
            with pytest.raises(ValueError, match="expected a number"):
                env.log_returns("x", {"a0": odd})


def test_episodes_without_training_are_played_and_counted_but_leave_no_rows():
    with EnvRunner(external_config({"name": PLAIN}, num_envs=2)) as runner:
        env = runner.env.get_sub_environments()[0]
        finished: list[bool] = []

        def client(training: bool, reward: float) -> None:
            eid = env.start_episode(training_enabled=training)
            for _ in range(3):
                env.get_action(eid, {"a0": np.zeros(3, np.float32)})
                env.log_returns(eid, {"a0": reward})
            env.end_episode(eid, {"a0": np.zeros(3, np.float32)})
            finished.append(training)

        for training, reward in ((False, 5.0), (True, 1.0)):
            threading.Thread(target=client, args=(training, reward), daemon=True).start()
        batches = step_until(runner, lambda: len(finished) == 2)
        metrics = runner.get_metrics()
    assert per_episode_totals(batches) == [3.0]  # only the training episode's rows
    assert sum(len(b.policy_batches["p"]) for b in batches) == 3
    assert metrics["episodes"] == 2 and metrics["episode_reward_max"] == 15.0


def test_quiet_client_ends_faulty_and_its_slot_is_reused():
    # A quiet client is the episode's fault, not the env's: no restart needed, nothing raised.
    cfg = external_config({"name": PLAIN}, num_envs=1, external_episode_timeout_s=0.3)
    with EnvRunner(cfg) as runner:
        env = runner.env.get_sub_environments()[0]
        state: dict[str, Any] = {}

        def quiet_client() -> None:
            eid = state["quiet"] = env.start_episode()
            for _ in range(2):
                env.get_action(eid, {"a0": np.zeros(3, np.float32), "a1": np.zeros(3, np.float32)})
            state["went_quiet"] = True

        threading.Thread(target=quiet_client, daemon=True).start()
        step_until(runner, lambda: runner.get_metrics()["num_faulty_episodes"] == 1
                   if "went_quiet" in state else False, timeout_s=10)
        with pytest.raises(ValueError, match=f"{state['quiet']!r} has already finished .*timed out"):
            env.get_action(state["quiet"], {"a0": np.zeros(3, np.float32)})

        def next_client() -> None:
            eid = env.start_episode()
            env.get_action(eid, {"a0": np.zeros(3, np.float32)})
            env.end_episode(eid, {"a0": np.zeros(3, np.float32)})
            state["next_done"] = True

        threading.Thread(target=next_client, daemon=True).start()
        batches = step_until(runner, lambda: "next_done" in state)
        metrics = runner.get_metrics()
    assert len(batches) == 1 and metrics["episodes"] == 1  # the faulty episode left no data
    assert len(batches[0].policy_batches["p"]) == 1


def test_start_episode_waits_for_a_slot_and_times_out():
    cfg = external_config({"name": PLAIN}, num_envs=1, external_episode_timeout_s=0.3)
    with EnvRunner(cfg) as runner:
        env = runner.env.get_sub_environments()[0]
        first = env.start_episode()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="all 1 episode slots stayed busy"):
            env.start_episode()
        assert time.monotonic() - started >= 0.25
        env.end_episode(first, {})
        env.start_episode()  # the slot is free again


def test_stop_unblocks_every_waiting_client():
    cfg = external_config({"name": PLAIN}, num_envs=1, external_episode_timeout_s=None)
    runner = EnvRunner(cfg)
    env = runner.env.get_sub_environments()[0]
    errors: list[BaseException] = []
    eid = env.start_episode()

    def waiting_for_action() -> None:
        try:
            env.get_action(eid, {"a0": np.zeros(3, np.float32)})
        except BaseException as exc:
            errors.append(exc)

    def waiting_for_slot() -> None:
        try:
            env.start_episode()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f, daemon=True) for f in (waiting_for_action, waiting_for_slot)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # both are blocked now: nobody steps the runner, the one slot is taken
    runner.stop()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()
    assert len(errors) == 2
    assert all(isinstance(e, ExternalEnvStopped) and "stopped" in str(e) for e in errors)
    with pytest.raises(ExternalEnvStopped):
        env.start_episode()


def test_stop_episodes_refuses_new_calls_and_the_runner_drains_what_was_queued():
    runner = EnvRunner(external_config({"name": PLAIN}, num_envs=2, external_episode_timeout_s=None))
    env = runner.env.get_sub_environments()[0]
    obs = {"a0": np.zeros(3, np.float32), "a1": np.zeros(3, np.float32)}
    ended, abandoned = env.start_episode(), env.start_episode()
    for _ in range(3):  # off-policy steps queue without waiting for the runner
        env.log_action(ended, obs, {"a0": 1, "a1": 2})
    env.end_episode(ended, obs)
    env.log_action(abandoned, obs, {"a0": 0, "a1": 0})
    runner.env.stop_episodes("the server is stopping")
    with pytest.raises(ExternalEnvStopped, match="the server is stopping"):
        env.log_action(abandoned, obs, {"a0": 0, "a1": 0})
    batches = []
    for _ in range(20):  # each poll takes one queued step per slot: a few rounds at most
        if runner.env.drained:
            break
        batches += [o for o in runner.step() if isinstance(o, MultiAgentBatch)]
    assert runner.env.drained
    assert len(batches) == 1 and batches[0].env_steps() == 3
    check_batch_invariants(batches[0])
    runner.stop()


def test_failing_run_is_reported_by_the_runner():
    with EnvRunner(external_config({"name": "tests.test_external_env:FailingRunEnv"})) as runner:
        with pytest.raises(EnvError, match="FailingRunEnv.run\\(\\) raised RuntimeError: simulator"):
            for _ in range(100):
                runner.step()


def test_external_needs_an_external_env():
    cfg = external_config({"name": "marl_runner.bench.envs:CheapEnv"})
    with pytest.raises(EnvError, match="needs env.name to build an ExternalMultiAgentEnv"):
        EnvRunner(cfg)
    with pytest.raises(EnvError, match="not served yet"):
        TwoAgentExternalEnv().start_episode()


def test_truncated_fragments_are_exact_in_env_steps():
    cfg = external_config(threaded(num_threads=2, episodes_per_thread=3, episode_len=6),
                          num_envs=2, batch_mode="truncate_episodes", rollout_fragment_length=4)
    with EnvRunner(cfg) as runner:
        env = runner.env.get_sub_environments()[0]
        batches = step_until(runner, env.done)
    assert batches
    for batch in batches:
        check_batch_invariants(batch, t_from_zero=False, rollout_fragment_length=4)
    # 2 threads x 3 episodes x 6 steps; each of the 2 slots keeps less than a fragment back.
    built = sum(b.env_steps() for b in batches)
    assert 36 - 2 * 4 < built <= 36
