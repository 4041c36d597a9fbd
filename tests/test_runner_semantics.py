"""Multi-agent semantics of the loop's step 2 (docs/DESIGN.md), each on a purpose-built env."""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from marl_runner import (
    EnvRunner,
    NoObservationError,
    Policy,
    SubEnvError,
    check_batch_invariants,
)
from marl_runner.checks import trajectory_rows
from marl_runner.envs import register_env
from tests.envs import CrashingEnv
from tests.envs.space_envs import DictObsEnv
from tests.runner_helpers import EpisodeTracker, assert_rewards_conserved, config

TESTING = "tests.envs:"


def _trajectories(batch, tracker: EpisodeTracker) -> dict:
    """``(eps_id, agent_id) -> rows`` of one policy batch named 'shared'."""
    shared = batch.policy_batches["shared"]
    return {
        (eps, tracker.agents[eps][index]): shared.select(rows)
        for (eps, index), rows in trajectory_rows(shared).items()
        if eps in tracker.agents
    }


def _one_episode(env: str, **overrides):
    tracker = EpisodeTracker()
    cfg = config(TESTING + env, batch_mode="complete_episodes", num_envs=1, **overrides)
    with EnvRunner(cfg, callbacks=tracker) as runner:
        batch = runner.sample(num_episodes=1)
        metrics = runner.get_metrics()
        assert_rewards_conserved(batch, runner, tracker)
    check_batch_invariants(batch)
    eps_id = tracker.ended[0]
    trajectories = {a: rows for (e, a), rows in _trajectories(batch, tracker).items() if e == eps_id}
    return trajectories, metrics


def test_dying_agents_end_where_they_die_and_a_silent_agent_gets_a_fake_final_obs() -> None:
    trajectories, _ = _one_episode("DyingAgentsEnv")
    assert {a: len(rows) for a, rows in trajectories.items()} == {"a0": 3, "a1": 6, "a2": 9, "a3": 5}
    for agent in ("a0", "a1", "a2"):
        assert trajectories[agent]["terminateds"][-1]
    a3 = trajectories["a3"]
    assert a3["terminateds"][-1] and not a3["truncateds"][-1]
    np.testing.assert_array_equal(a3["new_obs"][-1], np.zeros(3))  # fake_obs: zeros
    # a3 was rewarded in rounds it had no obs: credited on its next obs.
    np.testing.assert_allclose(a3["rewards"], [0.8] * 4 + [0.4], rtol=1e-6)


def test_time_limit_gives_the_fake_final_obs_truncated_not_terminated() -> None:
    trajectories, _ = _one_episode("TimeLimitEnv")
    for agent in ("a0", "a1"):
        rows = trajectories[agent]
        assert rows["truncateds"][-1] and not rows["terminateds"][-1], agent
        assert not (rows["terminateds"] | rows["truncateds"])[:-1].any()


@pytest.mark.parametrize("mode", ["last", "sample"])
def test_fake_obs_modes(mode: str) -> None:
    trajectories, _ = _one_episode("TimeLimitEnv", fake_obs=mode)
    a1 = trajectories["a1"]
    fake = a1["new_obs"][-1]
    if mode == "last":
        np.testing.assert_array_equal(fake, a1["obs"][-1])
    else:
        assert gym.spaces.Box(-1.0, 1.0, (3,), np.float32).contains(fake.astype(np.float32))


def test_spawning_agents_join_late_and_an_agent_born_done_is_skipped() -> None:
    trajectories, _ = _one_episode("SpawningAgentsEnv")
    assert set(trajectories) == {"a0", "a1", "a3"}
    # a1 was rewarded (0.5) before its first obs: it goes to its first transition.
    assert trajectories["a1"]["rewards"][0] == pytest.approx(1.5)
    assert trajectories["a1"]["terminateds"][-1]
    assert trajectories["a3"]["truncateds"][-1]
    assert trajectories["a0"]["truncateds"][-1]


def test_turn_based_rewards_without_obs_are_never_lost() -> None:
    trajectories, metrics = _one_episode("TurnBasedEnv")
    assert metrics["num_late_rewards"] == 0
    # p1's one transition: 1.0 given while it waited, 3.0 with its final obs, and
    # 2.0 after it was done (its final row was not handed out yet).
    assert trajectories["p1"]["rewards"].tolist() == pytest.approx([6.0])
    assert trajectories["p2"]["terminateds"][-1]  # ended without an obs: fake final obs


def test_a_reward_after_the_final_row_was_handed_out_is_counted_as_late() -> None:
    tracker = EpisodeTracker()
    cfg = config(TESTING + "TurnBasedEnv", num_envs=1, rollout_fragment_length=4)
    with EnvRunner(cfg, callbacks=tracker) as runner:
        runner.sample(num_env_steps=8)
        assert runner.get_metrics()["num_late_rewards"] == 1


def test_an_episode_without_any_observation_is_an_error() -> None:
    with EnvRunner(config(TESTING + "NoObsEnv", num_envs=1)) as runner:
        with pytest.raises(NoObservationError, match="never returned an observation for any agent"):
            runner.sample(num_env_steps=10)


_created = itertools.count()


def _crash_first_env(cfg: dict) -> CrashingEnv:
    """Only the first sub-env created crashes (once, at step 3)."""
    return CrashingEnv(crash_step=3 if next(_created) == 0 else None, step_crashes=1, episode_len=10)


register_env("crash_first_env", _crash_first_env)


@pytest.mark.parametrize("restart", [False, True])
def test_a_crashing_sub_env_loses_only_its_own_episode(restart: bool) -> None:
    global _created
    _created = itertools.count()
    tracker = EpisodeTracker()
    cfg = config("crash_first_env", num_envs=2, rollout_fragment_length=10,
                 restart_failed_sub_environments=restart)
    with EnvRunner(cfg, callbacks=tracker) as runner:
        if not restart:
            # Raised once the other sub-env's data of that round is safe, naming the sub-env
            # and carrying the env's own traceback; the runner goes on afterwards.
            with pytest.raises(SubEnvError, match=r"(?s)sub-env 0: failed .*planned crash in step 3") as raised:
                runner.sample(num_env_steps=60)
            assert "CrashingEnvError" in type(raised.value.__cause__).__name__
        batch = runner.sample(num_env_steps=60)
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == 1
    assert metrics["num_sub_env_restarts"] == int(restart)
    assert "planned crash in step 3" in metrics["faults"][0]
    check_batch_invariants(batch, rollout_fragment_length=10)
    shared = batch.policy_batches["shared"]
    # The faulty episode left no rows; the other env's first episode is complete.
    assert set(np.unique(shared["eps_id"])) <= set(tracker.started[0][1:] + tracker.started[1])
    assert tracker.started[1][0] in set(shared["eps_id"].tolist())


def test_callbacks_fire_in_episode_order() -> None:
    tracker = EpisodeTracker()
    with EnvRunner(config(TESTING + "TimeLimitEnv", num_envs=1), callbacks=tracker) as runner:
        runner.sample(num_env_steps=12)
    events = [name for name, _ in tracker.events]
    assert events[:2] == ["created", "start"]
    first_end = events.index("end")
    assert events[2:first_end] == ["step"] * 5
    assert events[first_end + 1 : first_end + 3] == ["created", "start"]


def test_count_by_agent_steps_builds_when_enough_transitions_closed() -> None:
    cfg = config(TESTING + "CheapEnv", num_envs=2, rollout_fragment_length=40,
                 count_steps_by="agent_steps", env_config={"num_agents": 4, "episode_len": 30})
    with EnvRunner(cfg) as runner:
        batches = [item for _ in range(12) for item in runner.step() if hasattr(item, "policy_batches")]
    assert batches
    for batch in batches:
        # Both envs step in lockstep: 4 agents x 10 rounds each = 40 agent steps per env.
        assert batch.agent_steps() == 2 * 40 and batch.env_steps() == 2 * 10
        check_batch_invariants(batch, t_from_zero=False)


def test_step_returns_batches_at_fragment_boundaries_and_metrics_at_episode_ends() -> None:
    cfg = config(TESTING + "CheapEnv", num_envs=2, rollout_fragment_length=5,
                 env_config={"num_agents": 2, "episode_len": 7})
    with EnvRunner(cfg) as runner:
        outputs = [runner.step() for _ in range(8)]
    kinds = [[type(item).__name__ for item in out] for out in outputs]
    # Call 0 is the reset round; calls 1..5 are env steps, so the fragment is built in call 5.
    assert kinds[5] == ["MultiAgentBatch"]
    assert kinds[7] == ["RolloutMetrics", "RolloutMetrics"]
    assert all(not k for i, k in enumerate(kinds) if i not in (5, 7))


def test_one_forward_pass_per_policy_per_step() -> None:
    cfg = config(TESTING + "CheapEnv", num_envs=3,
                 policies={"even": {}, "odd": {}},
                 policy_mapping_fn="tests.test_runner_semantics:by_parity",
                 env_config={"num_agents": 4, "episode_len": 10})
    with EnvRunner(cfg) as runner:
        calls = []
        for policy_id, policy in runner.policy_map.items():
            original = policy.compute_actions_from_input_dict

            def counted(input_dict, *args, _pid=policy_id, _original=original, **kwargs):
                done = input_dict["terminateds"] | input_dict["truncateds"]
                calls.append((_pid, int((~done).sum()), int(done.sum())))
                return _original(input_dict, *args, **kwargs)

            policy.compute_actions_from_input_dict = counted
        for _ in range(25):
            runner.step()
    assert len(calls) == 50
    # 2 agents of a parity x 3 sub-envs act every round; at episode ends the same pass
    # also gets their final rows (never sent, never opening a transition).
    assert {acting for _, acting, _ in calls} == {6}
    assert {done for _, _, done in calls} == {0, 6}


class FinalMaskAllowsNothingEnv(DictObsEnv):
    """A board game's last obs: no move is legal any more (its mask is all zeros)."""

    def step(self, actions):
        obs, rewards, terminateds, truncateds, infos = super().step(actions)
        if terminateds.get("__all__") or truncateds.get("__all__"):
            for agent_obs in obs.values():
                agent_obs["action_mask"] = np.zeros_like(agent_obs["action_mask"])
        return obs, rewards, terminateds, truncateds, infos


def test_a_final_obs_that_allows_no_action_is_stored_not_refused() -> None:
    """Final rows go through the policy's forward pass with the round's other rows; their
    mask is opened for it, since no action of theirs is ever sent."""
    cfg = config("tests.test_runner_semantics:FinalMaskAllowsNothingEnv", num_envs=2,
                 rollout_fragment_length=5)
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_env_steps=40)
    check_batch_invariants(batch, rollout_fragment_length=5)
    shared = batch.policy_batches["shared"]
    assert shared["terminateds"].any() or shared["truncateds"].any()
    assert shared["action_mask"][np.arange(len(shared)), shared["actions"]].all()


def by_parity(agent_id: str, episode, **kwargs) -> str:
    return "even" if int(agent_id.rsplit("_", 1)[1]) % 2 == 0 else "odd"


@pytest.mark.parametrize("env", ["BoxActionEnv", "MultiDiscreteEnv", "DictObsEnv", "MaskInfoEnv"])
def test_action_and_observation_spaces(env: str) -> None:
    with EnvRunner(config(TESTING + env, rollout_fragment_length=5)) as runner:
        batch = runner.sample(num_env_steps=20)
        spaces = runner.get_spaces()
    check_batch_invariants(batch, rollout_fragment_length=5)
    shared = batch.policy_batches["shared"]
    for column in ("action_logp", "action_dist_inputs", "vf_preds"):
        assert len(shared[column]) == len(shared)
    obs_space, action_space = spaces["shared"]
    assert obs_space.shape == shared["obs"].shape[1:]
    if "action_mask" in shared and env != "BoxActionEnv":
        flat = shared["actions"]
        if flat.ndim == 1:
            assert shared["action_mask"][np.arange(len(flat)), flat].all()


class ShapedOutputsPolicy(Policy):
    """A custom policy's outputs in the shapes the runner takes besides arrays, chosen by
    ``config["outputs"]``: Tuple actions as a tuple or list of batched parts, Discrete
    actions as a list of per-row ints (with a tuple of per-row floats as an extra
    output), or an extra output of the wrong kind."""

    def compute_actions_from_input_dict(
        self, input_dict: Any, explore: bool | None = None, timestep: int | None = None
    ) -> Any:
        rows = np.arange(len(input_dict["obs"]))
        outputs = self.config["outputs"]
        if outputs == "tuple_of_parts":
            return (rows % 2, rows % 3), [], {}
        if outputs == "list_of_parts":
            return [rows % 2, rows % 3], [], {}
        if outputs == "per_row":
            return (rows % 2).tolist(), [], {"score": tuple(rows * 0.5)}
        return rows % 2, [], {"score": 0.5}  # one number for all rows: refused


def _shaped_outputs_config(env: str, outputs: str, num_envs: int) -> Any:
    return config(
        TESTING + env, num_envs=num_envs, rollout_fragment_length=5,
        policies={"shared": {"policy_class": "tests.test_runner_semantics:ShapedOutputsPolicy",
                             "config": {"outputs": outputs}}},
    )


@pytest.mark.parametrize("outputs", ["tuple_of_parts", "list_of_parts"])
@pytest.mark.parametrize("num_envs", [1, 3])
def test_tuple_actions_are_stored_one_pair_per_row(num_envs: int, outputs: str) -> None:
    """With one sub-env of two agents a round has as many rows as the tuple has parts:
    the actions are still the policy's two batched parts, not two rows, and each row
    stores the pair its agent was sent."""
    env = "TupleActionEnv" if outputs == "tuple_of_parts" else "ListPairActionEnv"
    with EnvRunner(_shaped_outputs_config(env, outputs, num_envs)) as runner:
        batch = runner.sample()
    check_batch_invariants(batch, rollout_fragment_length=5)
    shared = batch.policy_batches["shared"]
    actions = shared["actions"]
    assert actions.dtype == object and len(actions) == 2 * num_envs * 5
    space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))
    assert all(space.contains(tuple(np.int64(part) for part in pair)) for pair in actions)
    # ShapedOutputsPolicy gives row i of a round (i % 2, i % 3): the parts differ per row.
    assert {tuple(int(part) for part in pair) for pair in actions} != {(0, 0)}


def test_per_row_lists_and_tuples_are_columns_of_their_values() -> None:
    with EnvRunner(_shaped_outputs_config("CheapEnv", "per_row", 1)) as runner:
        batch = runner.sample()
    shared = batch.policy_batches["shared"]
    assert shared["actions"].dtype == np.int64 and set(shared["actions"]) == {0, 1}
    assert shared["score"].dtype == np.float64 and len(shared["score"]) == len(shared)


def test_an_output_that_is_not_one_value_per_row_is_refused_by_name() -> None:
    with EnvRunner(_shaped_outputs_config("CheapEnv", "scalar_extra", 1)) as runner:
        with pytest.raises(ValueError, match="policy 'shared': its output 'score' is a float"):
            runner.sample()


@pytest.mark.parametrize(
    "backend", [{"vectorize": "sync"}, {"vectorize": "subprocess"},
                {"vectorize": "subprocess", "async_poll": True}], ids=["sync", "subprocess", "async"]
)
def test_an_env_reusing_its_arrays_keeps_each_episodes_final_obs(backend: dict) -> None:
    """The sub-env is reset in the step its episode ends, while the round still holds
    the final obs: without a copy the reset wrote the next episode's first obs over it.
    Its info dicts, which the batch keeps, are copied every step."""
    length = 4
    cfg = config(TESTING + "ReusedArraysEnv", num_envs=2, rollout_fragment_length=3 * length,
                 env_config={"length": length}, seed=0, **backend)
    with EnvRunner(cfg) as runner:
        batch = runner.sample()
    check_batch_invariants(batch)
    shared = batch.policy_batches["shared"]
    last = shared["truncateds"]
    assert last.sum() >= 2 * 3 * 2  # 3 episodes (or more, async) of each sub-env, 2 agents
    np.testing.assert_array_equal(shared["new_obs"][last, 0], length)
    np.testing.assert_array_equal(shared["new_obs"][~last, 0], shared["t"][~last] + 1)
    np.testing.assert_array_equal(shared["obs"][:, 0], shared["t"])
    # The env changes its info dicts in place too: each row keeps its own step's info
    # (the one that came with its new_obs), on every backend.
    np.testing.assert_array_equal([info["t"] for info in shared["infos"]], shared["t"] + 1)


def test_an_agent_with_obs_after_it_was_done_is_warned_of_and_its_rewards_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = config(TESTING + "ReturningAgentEnv", num_envs=1, batch_mode="complete_episodes")
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=2)
    check_batch_invariants(batch)
    shared = batch.policy_batches["shared"]
    a1 = shared["agent_id"] == "a1"
    # Per episode: its two rows (steps 0 and 1), the last one terminated and carrying
    # every reward it was given, the three after its return too.
    assert a1.sum() == 2 * 2 and shared["terminateds"][a1].sum() == 2
    assert shared["rewards"][a1].sum() == 2 * 5.0
    warnings = [r.message for r in caplog.records if "has an obs again" in r.message]
    assert len(warnings) == 1 and "sub-env 0: agent 'a1'" in warnings[0]


def test_complete_episodes_drop_an_episode_past_max_episode_steps() -> None:
    """Sub-env 0 (seed 0) never ends its episodes; sub-env 1 ends them after 5 steps.
    Each 20 steps sub-env 0's episode is dropped as faulty and the sub-env reset, so
    sample() returns sub-env 1's whole episodes, and nothing of sub-env 0."""
    cfg = config(TESTING + "NeverEndingOnEvenSeedsEnv", num_envs=2, seed=0,
                 batch_mode="complete_episodes", max_episode_steps=20)
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=20)
        metrics = runner.get_metrics()
    check_batch_invariants(batch)
    shared = batch.policy_batches["shared"]
    assert len(shared) == 20 * 5 and set(shared["env_id"]) == {1}
    assert metrics["num_faulty_episodes"] >= 100 // 20 - 1
    assert all("max_episode_steps=20" in fault for fault in metrics["faults"])


def test_sample_by_agent_steps_and_no_mask_column_without_masks() -> None:
    cfg = config(TESTING + "CheapEnv", num_envs=2, rollout_fragment_length=10,
                 env_config={"num_agents": 3, "episode_len": 15})
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_agent_steps=100)
    assert batch.agent_steps() >= 100 and batch.agent_steps() % (2 * 3 * 10) == 0
    # CheapEnv gives no masks: the preprocessor decided so and adds no all-ones column.
    assert "action_mask" not in batch.policy_batches["shared"]


def test_a_per_item_connector_sees_specs_keys_with_t_and_agent_index_from_the_runner() -> None:
    from connectors import LambdaAgentConnector

    seen = []

    def record(item):
        seen.append((item.agent_id, int(item.data["t"]), int(item.data["agent_index"]), set(item.data)))
        return item

    tracker = EpisodeTracker()
    cfg = config(TESTING + "DyingAgentsEnv", num_envs=1, batch_mode="complete_episodes")
    with EnvRunner(cfg, callbacks=tracker) as runner:
        pipeline = runner.policy_map.entries["shared"].agent_pipeline
        pipeline.append(LambdaAgentConnector(pipeline.ctx, record))
        batch = runner.sample(num_episodes=1)
    keys = {"t", "env_id", "agent_index", "rewards", "terminateds", "truncateds", "infos", "new_obs"}
    assert all(item_keys == keys for *_, item_keys in seen)
    # t counts each agent's obs from 0 in each episode (the next episode's reset obs
    # travel in the round the first one ends); agent_index is its place in the episode.
    runs: dict = {}
    for agent_id, t, index, _ in seen:
        if t == 0:
            runs.setdefault(agent_id, []).append([])
        runs[agent_id][-1].append(t)
        assert index == int(agent_id[1])
    assert all(run == list(range(len(run))) for agent_runs in runs.values() for run in agent_runs)
    assert len(runs["a2"][0]) == 10  # a2 lives through all 9 steps: reset obs + 9
    shared = batch.policy_batches["shared"]
    assert set(shared["agent_index"].tolist()) == {0, 1, 2, 3}


def test_episode_ids_are_positive_int64_and_differ_between_runners_with_one_seed() -> None:
    cfg = config(TESTING + "DyingAgentsEnv", batch_mode="complete_episodes", num_envs=2, seed=5)
    ids = []
    for _ in range(2):  # two runners, same seed: e.g. two processes or a restart
        with EnvRunner(cfg) as runner:
            shared = runner.sample(num_episodes=4).policy_batches["shared"]
        assert shared["eps_id"].dtype == np.int64 and (shared["eps_id"] > 0).all()
        ids.append(set(shared["eps_id"].tolist()))
    assert len(ids[0]) >= 4 and not ids[0] & ids[1]


@pytest.mark.parametrize(
    ("agent_ids", "spawn_last"),
    [([0, "0"], False), (["0", 0], False), (["a", 7, "7"], True),
     ([np.float32(0.1), 0.1], False)],
    ids=["int_first", "str_first", "spawned", "equal_numbers_of_two_types"],
)
@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_agents_whose_ids_read_alike_as_text_are_refused_by_name(
    agent_ids: list, spawn_last: bool, vectorize: str
) -> None:
    """0 and '0' are two agents to the env, one in the agent_id column and files; so are
    np.float32(0.1) and 0.1, two dict keys that even compare equal."""
    cfg = config(TESTING + "AgentIdsEnv", num_envs=1, rollout_fragment_length=4,
                 env_config={"agent_ids": agent_ids, "spawn_last": spawn_last},
                 vectorize=vectorize)
    with EnvRunner(cfg) as runner:
        with pytest.raises(ValueError, match=r"sub-env 0: agents .* read the same as text"):
            runner.sample()


def test_ids_of_other_types_that_read_differently_sample_as_str_ids_do() -> None:
    cfg = config(TESTING + "AgentIdsEnv", num_envs=2, rollout_fragment_length=8,
                 env_config={"agent_ids": ["a", 0, 1, (2, 3)], "spawn_last": True})
    with EnvRunner(cfg) as runner:
        batch = runner.sample()
    check_batch_invariants(batch, rollout_fragment_length=8)
    shared = batch.policy_batches["shared"]
    assert set(shared["agent_id"]) == {"a", "0", "1", "(2, 3)"}
