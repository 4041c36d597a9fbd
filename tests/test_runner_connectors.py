"""Connectors inside the runner, on real PettingZoo envs and the test envs.

Each built-in connector's effect is checked in the batches the runner
builds, through the public API only: configs (dicts and a YAML file), the
runner, its policy map, ``get_state``/``set_state``, checkpoints and
``get_metrics``. Many checks compare two runners that differ only in one
connector: with ``RandomPolicy`` (which never looks at observations) and
equal seeds both see exactly the same env data, so the connector's effect
is the only difference between their batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers_connectors import make_rows
from helpers_runner_connectors import (
    FILTER,
    OffPolicyVectorEnv,
    assert_same_policies,
    config,
    filter_of,
    filtered_kaz_config,
    kaz,
    one_torch_thread,  # noqa: F401 (a fixture)
    perturbed_weights,
)

import marl_runner.sampling.runner as runner_module
from connectors import StateBufferConnector
from marl_runner import EnvRunner, RunnerConfig, SampleBatch, concat_samples

SPREAD = "mpe2.simple_spread_v3:parallel_env"
TICTACTOE = "pettingzoo.classic.tictactoe_v3:env"
CONNECT_FOUR = "pettingzoo.classic.connect_four_v3:env"
RECORDING_BOX = "helpers_runner_connectors:RecordingBoxEnv"
RANDOM_POLICY = "marl_runner.policy.random_policy:RandomPolicy"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spread(max_cycles: int = 25) -> dict[str, Any]:
    return {"name": SPREAD, "config": {"max_cycles": max_cycles}}


def random_policy(**spec: Any) -> dict[str, Any]:
    """A RandomPolicy entry: its actions never depend on the observations."""
    return {"policy_class": RANDOM_POLICY, **spec}


def sample_fragments(runner: EnvRunner, policy_id: str, count: int) -> SampleBatch:
    """``count`` default samples (one fragment per sub-env each), one policy's rows joined."""
    return concat_samples([runner.sample().policy_batches[policy_id] for _ in range(count)])


def by_trajectory(batch: SampleBatch) -> Iterator[np.ndarray]:
    """Row indices of each (episode, agent) trajectory, in time order."""
    order = np.lexsort((batch["t"], batch["agent_index"], batch["eps_id"]))
    eps, agents = batch["eps_id"][order], batch["agent_index"][order]
    starts = np.flatnonzero(np.r_[True, (eps[1:] != eps[:-1]) | (agents[1:] != agents[:-1])])
    for rows in np.split(order, starts[1:]):
        t = batch["t"][rows]
        assert (np.diff(t) == 1).all(), f"trajectory rows are not consecutive: {t}"
        yield rows


def sorted_rows(batch: SampleBatch) -> SampleBatch:
    """The batch's rows in (episode, agent, t) order, to line up two runners' batches."""
    order = np.lexsort((batch["t"], batch["agent_index"], batch["eps_id"]))
    return SampleBatch({name: column[order] for name, column in batch.items()})


def twin_batches(
    env: dict[str, Any],
    spec_a: dict[str, Any],
    spec_b: dict[str, Any],
    fragments: int = 2,
    **kw: Any,
) -> tuple[SampleBatch, SampleBatch]:
    """Batches of two otherwise equal runners whose only policy ``p`` differs as given."""
    batches = []
    for spec in (spec_a, spec_b):
        with EnvRunner(config(env, {"p": random_policy(**spec)}, **kw)) as runner:
            batches.append(sorted_rows(sample_fragments(runner, "p", fragments)))
    a, b = batches
    # episode ids are random per runner, in creation order: the same rows share an id in both
    np.testing.assert_array_equal(
        np.unique(a["eps_id"], return_inverse=True)[1], np.unique(b["eps_id"], return_inverse=True)[1]
    )
    np.testing.assert_array_equal(a["t"], b["t"])
    np.testing.assert_array_equal(a["actions"], b["actions"])
    return a, b


# --------------------------------------------------------------------------- obs preprocessing


@pytest.mark.parametrize(
    ("env_name", "board_shape"),
    [(TICTACTOE, (3, 3, 2)), (CONNECT_FOUR, (6, 7, 2))],
    ids=["tictactoe", "connect_four"],
)
def test_obs_preprocessor_flattens_dict_obs_and_puts_masks_in_the_batch(env_name, board_shape):
    policies = {"p": {"agent_connectors": ["ObsPreprocessorConnector"]}}
    cfg = config({"name": env_name}, policies, batch_mode="complete_episodes")
    with EnvRunner(cfg) as runner:
        assert runner.get_spaces()["p"][0].shape == (int(np.prod(board_shape)),)
        batch = runner.sample(num_episodes=4).policy_batches["p"]
    n, num_actions = len(batch), runner.get_spaces()["p"][1].n
    assert batch["obs"].dtype == np.float32 and batch["obs"].shape == (n, np.prod(board_shape))
    assert batch["action_mask"].shape == (n, num_actions)
    mask = batch["action_mask"].astype(bool)
    assert mask[np.arange(n), batch["actions"]].all(), "a masked action was chosen"
    assert not mask.all(), "the masks never forbid anything: they are not the env's"
    board = batch["obs"].reshape(n, *board_shape).sum(axis=-1)  # both players' planes
    if env_name == TICTACTOE:
        expected = (board == 0).reshape(n, 9)  # an empty cell is a legal move
    else:
        expected = board[:, 0, :] == 0  # a column with an empty top cell
    np.testing.assert_array_equal(mask, expected)


@pytest.mark.parametrize("env_class", ["DictObsEnv", "MaskInfoEnv"])
def test_obs_preprocessor_takes_masks_from_dict_obs_or_infos(env_class):
    env = {"name": f"tests.envs:{env_class}", "config": {"num_actions": 6}}
    policies = {"p": {"model": {"type": "mlp", "hidden": [8]}}}  # the default agent chain
    with EnvRunner(config(env, policies, rollout_fragment_length=6)) as runner:
        batch = sample_fragments(runner, "p", 3)
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == 0  # these envs reject any masked action
    assert batch["obs"].shape == (len(batch), 3)  # the mask is not part of the obs
    mask = batch["action_mask"].astype(bool)
    assert mask.shape == (len(batch), 6) and not mask.all()
    assert mask[np.arange(len(batch)), batch["actions"]].all()


# --------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    ("params", "clip"),
    [
        ({"limit": 0.1}, lambda r: np.clip(r, -0.1, 0.1)),
        ({"sign": True}, np.sign),
        ({"sign": True, "limit": 0.5}, lambda r: np.clip(np.sign(r), -0.5, 0.5)),
    ],
    ids=["limit", "sign", "sign_and_limit"],
)
def test_clip_reward_in_the_runner(params, clip):
    chain = ["ObsPreprocessorConnector", {"name": "ClipRewardAgentConnector", **params}]
    clipped, raw = twin_batches(spread(), {"agent_connectors": chain}, {})
    assert np.abs(raw["rewards"]).max() > 0.5  # simple_spread rewards are big enough to clip
    np.testing.assert_allclose(clipped["rewards"], clip(raw["rewards"]), rtol=1e-6)
    np.testing.assert_array_equal(clipped["obs"], raw["obs"])


def test_clip_reward_leaves_episode_metrics_raw():
    chain = ["ObsPreprocessorConnector", {"name": "ClipRewardAgentConnector", "limit": 0.01}]
    cfg = config(spread(max_cycles=10), {"p": random_policy(agent_connectors=chain)})
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=2).policy_batches["p"]
        metrics = runner.get_metrics()
    assert np.abs(batch["rewards"]).max() <= 0.01
    # Metrics report what the env gave: 10 steps x 3 agents of rewards far below -0.01 each.
    assert metrics["episode_reward_mean"] < -10 * 3 * 0.01


def test_lambda_agent_connector_from_an_import_path():
    chain = [
        "ObsPreprocessorConnector",
        {"name": "LambdaAgentConnector", "fn": "helpers_runner_connectors:double_rewards"},
    ]
    doubled, raw = twin_batches(spread(), {"agent_connectors": chain}, {})
    np.testing.assert_allclose(doubled["rewards"], 2 * raw["rewards"], rtol=1e-6)


# --------------------------------------------------------------------------- observation filter


def test_mean_std_filter_normalises_and_learns_only_in_training():
    chain = ["ObsPreprocessorConnector", FILTER]
    runners = [
        EnvRunner(config(kaz(), {"p": random_policy(agent_connectors=chain)})),
        EnvRunner(config(kaz(), {"p": random_policy()})),
    ]
    filtered_runner, raw_runner = runners
    try:
        filt = filter_of(filtered_runner, "p")
        counts = [filt.get_state()["count"]]
        for _ in range(2):  # training: every round's observations update the statistics
            for runner in runners:
                runner.sample()
            counts.append(filt.get_state()["count"])
        assert counts[0] == 0 and counts[0] < counts[1] < counts[2]

        filtered_runner.policy_map["p"].agent_connectors.in_eval()
        frozen = filt.get_state()
        filtered = sorted_rows(filtered_runner.sample().policy_batches["p"])
        raw = sorted_rows(raw_runner.sample().policy_batches["p"])
        assert filt.get_state() == frozen  # eval: statistics unchanged
        mean = np.asarray(frozen["mean"])
        std = np.sqrt(np.asarray(frozen["m2"]) / frozen["count"])
        scale = np.where(std > 1e-8, 1.0 / np.maximum(std, 1e-8), 1.0)
        for column in ("obs", "new_obs"):
            expected = np.clip((raw[column] - mean) * scale, -10.0, 10.0)
            np.testing.assert_allclose(filtered[column], expected, atol=1e-4)
        assert not np.allclose(filtered["obs"], raw["obs"])

        filtered_runner.policy_map["p"].agent_connectors.in_training()
        filtered_runner.sample()
        assert filt.get_state()["count"] > frozen["count"]
    finally:
        for runner in runners:
            runner.stop()


# --------------------------------------------------------------------------- recurrent state


def lstm_config(**overrides: Any) -> RunnerConfig:
    policy = {
        "policy_class": "helpers_runner_connectors:CountingTorchPolicy",
        "model": {"type": "lstm", "hidden": [16], "lstm_cell_size": 8},
    }
    return config(kaz(max_cycles=20), {"p": policy}, **overrides)


def test_lstm_state_columns_follow_each_agent_and_reset_with_its_episode():
    with EnvRunner(lstm_config(batch_mode="complete_episodes")) as runner:
        batch = runner.sample(num_episodes=4).policy_batches["p"]
    n = len(batch)
    for i in range(2):
        assert batch[f"state_in_{i}"].shape == (n, 8) == batch[f"state_out_{i}"].shape
    assert batch["seq_lens"].dtype == np.int32 and (batch["seq_lens"] == 1).all()
    episodes_per_env: dict[int, set] = {}
    for rows in by_trajectory(batch):
        episodes_per_env.setdefault(int(batch["env_id"][rows[0]]), set()).add(
            int(batch["eps_id"][rows[0]])
        )
        assert batch["t"][rows[0]] == 0
        for i in range(2):
            state_in, state_out = batch[f"state_in_{i}"][rows], batch[f"state_out_{i}"][rows]
            np.testing.assert_array_equal(state_in[0], 0.0)  # every episode starts afresh
            np.testing.assert_array_equal(state_in[1:], state_out[:-1])
            assert np.abs(state_out).sum() > 0
    assert max(len(e) for e in episodes_per_env.values()) >= 2  # later episodes reset too


def test_lstm_states_differ_per_agent_in_one_batched_forward_pass():
    with EnvRunner(lstm_config()) as runner:
        policy = runner.policy_map["p"]
        steps = 6
        for _ in range(steps):
            runner.step()
    calls = policy.calls
    assert len(calls) == steps  # ONE forward pass per round for all agents of all sub-envs
    num_agents = len(runner.env.possible_agents)
    assert calls[0]["num_rows"] == 2 * num_agents  # the reset obs of both sub-envs
    assert sorted(set(calls[0]["env_ids"].tolist())) == [0, 1]
    np.testing.assert_array_equal(calls[0]["state_in_0"], 0.0)
    later = calls[-1]["state_in_0"]
    assert len(np.unique(later, axis=0)) == len(later), "agents share an RNN state"


def test_lstm_batch_over_fragments_keeps_state_continuity():
    with EnvRunner(lstm_config(rollout_fragment_length=7)) as runner:
        batch = sample_fragments(runner, "p", 4)
    for rows in by_trajectory(batch):
        np.testing.assert_array_equal(
            batch["state_in_0"][rows][1:], batch["state_out_0"][rows][:-1]
        )


# --------------------------------------------------------------------------- view requirements


@pytest.mark.parametrize(
    "env",
    [
        spread(max_cycles=12),
        {"name": CONNECT_FOUR},
        {"name": "tests.envs:MultiDiscreteEnv", "config": {"episode_len": 7}},
        {"name": RECORDING_BOX, "config": {"low": -100.0, "high": 100.0, "episode_len": 7}},
    ],
    ids=["simple_spread", "connect_four", "multi_discrete", "box"],
)
def test_prev_actions_and_prev_rewards_within_trajectories(env):
    view = {"prev_actions": {}, "prev_rewards": {}}
    policy = {"model": {"type": "mlp", "hidden": [8]}, "config": {"view_requirements": view}}
    cfg = config(env, {"p": policy}, rollout_fragment_length=5)
    with EnvRunner(cfg) as runner:
        batch = sample_fragments(runner, "p", 4)
    assert batch["prev_actions"].shape == batch["actions"].shape
    checked = 0
    for rows in by_trajectory(batch):
        prev_actions, prev_rewards = batch["prev_actions"][rows], batch["prev_rewards"][rows]
        np.testing.assert_array_equal(prev_actions[1:], batch["actions"][rows][:-1])
        np.testing.assert_array_equal(prev_rewards[1:], batch["rewards"][rows][:-1])
        if batch["t"][rows[0]] == 0:
            assert (prev_actions[0] == 0).all() and prev_rewards[0] == 0.0
            checked += 1
    assert checked >= 2
    assert batch["prev_actions"].any()
    if env["name"] != CONNECT_FOUR:  # board games only reward the last move: no prev_rewards
        assert batch["prev_rewards"].any()


def test_prev_actions_follow_off_policy_actions(monkeypatch):
    real_make = runner_module.make_vector_env
    monkeypatch.setattr(
        runner_module, "make_vector_env", lambda cfg: OffPolicyVectorEnv(real_make(cfg), 0)
    )
    view = {"prev_actions": {}}
    cfg = config(kaz(max_cycles=12), {"p": {"config": {"view_requirements": view}}})
    with EnvRunner(cfg) as runner:
        batch = sample_fragments(runner, "p", 2)
    assert (batch["actions"] == 0).all()  # the env's actions are stored
    for rows in by_trajectory(batch):
        np.testing.assert_array_equal(batch["prev_actions"][rows][1:], batch["actions"][rows][:-1])


def test_frame_stacking_pads_episode_starts_and_never_mixes_episodes():
    frames = 3
    stacked_spec = {"config": {"view_requirements": {"obs": {"frames": frames}}}}
    # Short episodes and fragments: episodes cross fragments and sub-envs reset in between.
    stacked, raw = twin_batches(
        kaz(max_cycles=12), stacked_spec, {}, fragments=5, rollout_fragment_length=7
    )
    assert stacked["obs"].shape == (len(raw), frames, raw["obs"].shape[1])
    episode_starts = 0
    for rows in by_trajectory(raw):
        history = raw["obs"][rows]
        if raw["t"][rows[0]] != 0:
            continue  # a trajectory whose start was handed out before these fragments
        episode_starts += 1
        padded = np.concatenate([np.zeros((frames - 1, history.shape[1]), np.float32), history])
        expected = np.stack([padded[i : i + frames] for i in range(len(history))])
        np.testing.assert_array_equal(stacked["obs"][rows], expected)
        np.testing.assert_array_equal(stacked["new_obs"][rows][:-1], expected[1:])
        np.testing.assert_array_equal(stacked["new_obs"][rows][:, -1], raw["new_obs"][rows])
    assert episode_starts > len(np.unique(raw["agent_index"]))  # second episodes included


# --------------------------------------------------------------------------- action connectors


def box_config(chain: list | None = None, low: float = -1.0, high: float = 1.0, **kw: Any):
    policy: dict[str, Any] = {"model": {"type": "mlp", "hidden": [8]}}
    if chain is not None:
        policy["action_connectors"] = chain
    env = {"name": RECORDING_BOX, "config": {"low": low, "high": high, "episode_len": 6}}
    return RunnerConfig.from_dict(
        {
            "env": env,
            "num_envs": 1,
            "batch_mode": "complete_episodes",
            "policies": {"p": policy},
            **kw,
        }
    )


def sent_and_stored(cfg: RunnerConfig) -> tuple[np.ndarray, np.ndarray, list, dict]:
    """Actions the env got and the raw ones in the batch, for the first episode, plus metrics."""
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=1).policy_batches["p"]
        env = runner.env.get_sub_environments()[0]
        metrics = runner.get_metrics()
    agents = env.possible_agents
    rows = sorted_rows(batch)
    stored = np.stack([rows["actions"][rows["agent_index"] == i] for i in range(len(agents))], 1)
    steps = stored.shape[0]
    received = [[step[a] for a in agents] for step in env.received[:steps]]
    sent = np.asarray(received, np.float32)
    return sent, stored, received, metrics


def test_clip_actions_sends_clipped_and_stores_raw_actions():
    chain = ["ConvertToNumpyConnector", "ClipActionsConnector"]
    sent, stored, _, metrics = sent_and_stored(box_config(chain))
    assert metrics["num_faulty_episodes"] == 0  # the env rejects any action outside its box
    assert (np.abs(stored) > 1).any(), "the policy never left the box: nothing was clipped"
    np.testing.assert_allclose(sent, np.clip(stored, -1.0, 1.0), rtol=1e-6)


@pytest.mark.parametrize(
    "chain",
    [None, ["ConvertToNumpyConnector", "NormalizeActionsConnector"]],
    ids=["default_chain_with_normalize_actions", "explicit_chain"],
)
def test_normalize_actions_maps_unit_range_onto_the_bounds(chain):
    sent, stored, _, metrics = sent_and_stored(box_config(chain, 0.0, 4.0, normalize_actions=True))
    assert metrics["num_faulty_episodes"] == 0
    np.testing.assert_allclose(sent, 2.0 * (np.clip(stored, -1.0, 1.0) + 1.0), rtol=1e-5, atol=1e-6)
    assert (sent >= 0).all() and (sent <= 4).all()


def test_immutable_actions_reach_the_env_read_only():
    chain = ["ConvertToNumpyConnector", "ClipActionsConnector", "ImmutableActionsConnector"]
    _, stored, received, metrics = sent_and_stored(box_config(chain))
    assert metrics["num_faulty_episodes"] == 0
    assert all(not action.flags.writeable for step in received for action in step)
    _, _, received_plain, _ = sent_and_stored(box_config(chain[:2]))
    assert all(action.flags.writeable for step in received_plain for action in step)


def test_lambda_action_connector_changes_env_actions_only():
    chain = [
        "ConvertToNumpyConnector",
        "ClipActionsConnector",
        {"name": "LambdaActionConnector", "fn": "helpers_runner_connectors:halve_actions"},
    ]
    sent, stored, _, metrics = sent_and_stored(box_config(chain))
    assert metrics["num_faulty_episodes"] == 0
    np.testing.assert_allclose(sent, 0.5 * np.clip(stored, -1.0, 1.0), rtol=1e-6)


def test_an_empty_action_chain_sends_the_raw_actions():
    cfg = box_config([], -100.0, 100.0)  # bounds wide enough for any raw action
    with EnvRunner(cfg) as runner:
        assert len(runner.policy_map["p"].action_connectors) == 0
    sent, stored, _, metrics = sent_and_stored(cfg)
    assert metrics["num_faulty_episodes"] == 0
    np.testing.assert_array_equal(sent, stored)


# --------------------------------------------------------------------------- YAML chain


YAML_CONFIG = """
env:
  name: {spread}
  config: {{max_cycles: 15}}
num_envs: 2
batch_mode: complete_episodes
seed: 3
policies:
  leader:
    model: {{type: mlp, hidden: [16]}}
    agent_connectors:
      - ObsPreprocessorConnector
      - {{name: "helpers_runner_connectors:TagRowsConnector", tag: 7.0, reward_scale: 0.5}}
      - MeanStdObservationFilterAgentConnector
    action_connectors:
      - ConvertToNumpyConnector
      - ImmutableActionsConnector
  others:
    policy_class: {random_policy}
policy_mapping_fn: {{"agent_0": leader, "agent_*": others}}
"""


def test_yaml_chain_with_a_user_connector_from_an_import_path(tmp_path):
    path = tmp_path / "spread.yaml"
    path.write_text(YAML_CONFIG.format(spread=SPREAD, random_policy=RANDOM_POLICY))
    cfg = RunnerConfig.from_yaml(path)
    assert RunnerConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    with EnvRunner(cfg) as runner:
        batch = runner.sample(num_episodes=2)
        metrics = runner.get_metrics()
        state = runner.get_state()
    leader, others = batch.policy_batches["leader"], batch.policy_batches["others"]
    assert (leader["user_tag"] == 7.0).all() and "user_tag" not in others
    assert np.abs(leader["obs"]).max() <= 10.0  # the filter after it ran too
    # Metrics hold the env's rewards; the leader's batch rewards went through reward_scale.
    assert metrics["episodes"] == 2
    leader_return = leader["rewards"].astype(np.float64).sum() / 2
    assert leader_return == pytest.approx(0.5 * metrics["policy_reward_mean"]["leader"], rel=1e-5)
    others_return = others["rewards"].astype(np.float64).sum() / 2
    assert others_return == pytest.approx(metrics["policy_reward_mean"]["others"], rel=1e-5)
    names = [name for name, _ in state["leader"]["agent_connectors"]]
    assert names == [
        "ObsPreprocessorConnector",
        "helpers_runner_connectors:TagRowsConnector",
        FILTER,
    ]
    assert state["leader"]["agent_connectors"][1][1] == {"tag": 7.0, "reward_scale": 0.5}
    assert state["leader"]["agent_connectors"][2][1]["state"]["count"] > 0


# --------------------------------------------------------------------------- state round trips


def normalised(runner: EnvRunner, policy_id: str, obs: np.ndarray) -> np.ndarray:
    """What the policy's filter makes of ``obs`` (in eval mode, so it learns nothing)."""
    filt = filter_of(runner, policy_id)
    filt.in_eval()
    try:
        return filt(make_rows(obs))["obs"]
    finally:
        filt.in_training()


def test_get_state_set_state_into_a_fresh_runner():
    with EnvRunner(filtered_kaz_config()) as trained, EnvRunner(filtered_kaz_config()) as fresh:
        trained.set_weights(perturbed_weights(trained))
        trained.sample()
        assert filter_of(trained, "archer").get_state()["count"] > 0
        fresh.set_state(trained.get_state())
        assert_same_policies(trained, fresh)
        obs = np.random.default_rng(0).normal(size=(4, 135)).astype(np.float32)
        for pid in ("archer", "knight"):
            np.testing.assert_array_equal(
                normalised(fresh, pid, obs), normalised(trained, pid, obs)
            )
        batch = fresh.sample()  # the restored runner samples, and its filters go on learning
        assert len(batch.policy_batches["archer"]) > 0
        assert (
            filter_of(fresh, "archer").get_state()["count"]
            > filter_of(trained, "archer").get_state()["count"]
        )


def test_connector_state_is_json_ready():
    with EnvRunner(filtered_kaz_config()) as runner:
        runner.sample()
        state = runner.get_state()
    for policy_state in state.values():
        json.dumps([policy_state["agent_connectors"], policy_state["action_connectors"]])


def test_set_state_between_samples_keeps_running_rnn_states():
    with EnvRunner(filtered_kaz_config(num_envs=1)) as runner:
        runner.sample()  # fragments of 10 steps: the first episode goes on
        runner.set_state(runner.get_state())  # e.g. filter statistics synced from a driver
        batch = runner.sample().policy_batches["archer"]
    for rows in by_trajectory(batch):
        np.testing.assert_array_equal(
            batch["state_in_0"][rows][1:], batch["state_out_0"][rows][:-1]
        )


def test_set_state_keeps_eval_mode():
    with EnvRunner(filtered_kaz_config()) as runner:
        runner.sample()
        runner.policy_map["knight"].agent_connectors.in_eval()
        runner.set_state(runner.get_state())
        frozen = filter_of(runner, "knight").get_state()
        runner.sample()
        assert filter_of(runner, "knight").get_state() == frozen


def test_set_state_keeps_the_policies_pipeline_objects_in_sync():
    with EnvRunner(filtered_kaz_config()) as runner:
        runner.sample()
        runner.set_state(runner.get_state())
        policy = runner.policy_map["archer"]
        assert isinstance(policy.agent_connectors[StateBufferConnector], StateBufferConnector)
        count = filter_of(runner, "archer").get_state()["count"]
        runner.sample()  # the filter the runner uses is the one the policy exposes
        assert filter_of(runner, "archer").get_state()["count"] > count


# --------------------------------------------------------------------------- connector metrics


def test_connector_metrics_per_policy_and_json_ready():
    cfg = filtered_kaz_config()
    with EnvRunner(cfg) as runner:
        steps = 5
        for _ in range(steps):
            runner.step()
        metrics = runner.get_metrics()
        again = runner.get_metrics()
    connector_metrics = metrics["connector_metrics"]
    assert set(connector_metrics) == {"archer", "knight"}
    for pid, per_policy in connector_metrics.items():
        assert set(per_policy) == {"agent", "action"}
        assert list(per_policy["agent"]) == [
            "ObsPreprocessorConnector",
            FILTER,
            "StateBufferConnector",
        ]
        assert list(per_policy["action"]) == ["ConvertToNumpyConnector", "ClipActionsConnector"]
        for timing in [*per_policy["agent"].values(), *per_policy["action"].values()]:
            assert set(timing) == {"mean_ms", "total_ms", "calls"}
            assert timing["calls"] == steps, pid  # every round had rows of every policy
            assert 0.0 <= timing["mean_ms"] <= timing["total_ms"]
    assert json.loads(json.dumps(connector_metrics)) == connector_metrics
    assert again["connector_metrics"] == {
        "archer": {"agent": {}, "action": {}},
        "knight": {"agent": {}, "action": {}},
    }
