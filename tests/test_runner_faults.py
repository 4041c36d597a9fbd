"""The runner after an exception: usable, nothing built lost or repeated; failures bounded."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from connectors import AgentConnector, LambdaAgentConnector
from connectors.data import AgentRows
from marl_runner import (
    Callbacks,
    EnvRunner,
    MultiAgentBatch,
    SubEnvError,
    check_batch_invariants,
)
from marl_runner.checks import trajectory_rows
from marl_runner.envs import MultiAgentEnv
from marl_runner.envs.errors import EnvError
from marl_runner.envs.registry import register_env
from marl_runner.sampling import lifecycle
from tests.runner_helpers import config

CRASHING = "tests.envs:CrashingEnv"


def assert_nothing_lost_or_repeated(batches: list[MultiAgentBatch]) -> None:
    """Fragments are numbered as built (unroll_id): all of them, each once, each whole."""
    unroll_ids = []
    for batch in batches:
        check_batch_invariants(batch, t_from_zero=False)
        for policy_batch in batch.policy_batches.values():
            unroll_ids.extend(np.unique(policy_batch["unroll_id"]).tolist())
            for rows in trajectory_rows(policy_batch).values():
                assert len(np.unique(policy_batch["t"][rows])) == len(rows)  # no row twice
    unroll_ids = sorted(set(unroll_ids))
    assert unroll_ids == list(range(1, len(unroll_ids) + 1)), unroll_ids


@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_keyboard_interrupt_inside_an_env_step_leaves_the_runner_usable(
    vectorize: str, tmp_path: Path
) -> None:
    cfg = config(
        CRASHING,
        num_envs=1,
        vectorize=vectorize,
        rollout_fragment_length=2,
        env_config={
            "crash_step": 7,
            "fault": "interrupt",
            "fault_token": str(tmp_path / "t"),
            "episode_len": 10,
        },
    )
    with EnvRunner(cfg) as runner:
        with pytest.raises((KeyboardInterrupt, SubEnvError)):
            runner.sample(num_env_steps=40)  # three fragments are built before the interrupt
        after = runner.sample(num_env_steps=40)
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == 1
    assert after.env_steps() >= 40
    assert_nothing_lost_or_repeated([after])


def _raise_on_call(number: int) -> Any:
    calls = []

    def connector(rows: Any) -> Any:
        calls.append(1)
        if len(calls) == number:
            raise RuntimeError(f"connector failure on call {number}")
        return rows

    return connector


def _two_cheap_sub_envs(**overrides: Any) -> Any:
    return config(
        "marl_runner.bench.envs:CheapEnv",
        num_envs=2,
        rollout_fragment_length=3,
        env_config={"num_agents": 2, "episode_len": 7},
        **overrides,
    )


def test_a_connector_error_mid_sample_loses_no_built_fragment() -> None:
    cfg = _two_cheap_sub_envs()
    with EnvRunner(cfg) as runner:
        runner.policy_map.entries["shared"].agent_pipeline.append(
            LambdaAgentConnector(
                runner.policy_map.entries["shared"].agent_pipeline.ctx, _raise_on_call(11)
            )
        )
        with pytest.raises(RuntimeError, match="connector failure on call 11"):
            runner.sample(num_env_steps=60)
        batches = [runner.sample(num_env_steps=30) for _ in range(2)]
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == 2  # both sub-envs were mid-step
    assert_nothing_lost_or_repeated(batches)


class _ColumnMisshapenOnCall(AgentConnector):
    """Adds a column the store keeps, two values wide on call ``number`` only: storing
    that round's rows raises, after its actions were sent."""

    def __init__(self, ctx: Any, number: int) -> None:
        super().__init__(ctx)
        self.number, self.calls = number, 0

    def __call__(self, rows: AgentRows) -> AgentRows:
        self.calls += 1
        width = (2,) if self.calls == self.number else ()
        rows["extra"] = np.zeros((len(rows), *width), np.float32)
        return rows


@pytest.mark.parametrize(
    "vectorize",
    [{"vectorize": "sync"}, {"vectorize": "subprocess"},
     {"vectorize": "subprocess", "num_envs_per_poll": 1}],
)
def test_a_store_error_after_the_send_drops_the_round_and_loses_nothing_built(
    vectorize: dict,
) -> None:
    cfg = _two_cheap_sub_envs(**vectorize)
    with EnvRunner(cfg) as runner:
        pipeline = runner.policy_map.entries["shared"].agent_pipeline
        pipeline.append(_ColumnMisshapenOnCall(pipeline.ctx, 11))
        with pytest.raises(ValueError):
            runner.sample(num_env_steps=60)
        batches = [runner.sample(num_env_steps=30) for _ in range(2)]
        metrics = runner.get_metrics()
    # The round's sub-envs were sent actions, their rows not stored: both of them, or with
    # an async pool those that were ready.
    faulty = metrics["num_faulty_episodes"]
    assert faulty == 2 if "num_envs_per_poll" not in vectorize else 1 <= faulty <= 2
    assert_nothing_lost_or_repeated(batches)
    for batch in batches:
        assert batch.policy_batches["shared"]["extra"].shape[1:] == ()


class _FailingOnce(Callbacks):
    def __init__(self) -> None:
        self.calls = 0

    def on_sample_end(self, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("logger down")


def test_an_on_sample_end_error_loses_no_batch() -> None:
    cfg = config(
        "marl_runner.bench.envs:CheapEnv",
        num_envs=2,
        rollout_fragment_length=5,
        env_config={"num_agents": 2, "episode_len": 7},
    )
    with EnvRunner(cfg, callbacks=_FailingOnce()) as runner:
        with pytest.raises(RuntimeError, match="logger down"):
            runner.sample()
        again = runner.sample()
    assert again.env_steps() == 20  # the failed call's 2 fragments, then 2 new ones
    assert_nothing_lost_or_repeated([again])


def test_every_sub_env_crashing_every_episode_ends_with_an_error_not_a_loop() -> None:
    cfg = config(
        CRASHING,
        num_envs=2,
        restart_failed_sub_environments=True,
        max_consecutive_step_failures=3,
        env_config={"crash_step": 2},
    )
    with EnvRunner(cfg) as runner:
        with pytest.raises(SubEnvError, match=r"(?s)3 episodes in a row failed.*planned crash"):
            runner.sample(num_env_steps=1000)
        metrics = runner.get_metrics()
    assert 3 <= metrics["num_faulty_episodes"] <= 6
    assert metrics["num_sub_env_restarts"] >= 2


def test_resets_that_keep_failing_end_with_an_error_naming_the_sub_env() -> None:
    cfg = config(
        CRASHING,
        num_envs=2,
        max_consecutive_reset_failures=4,
        env_config={"crash_step": None, "reset_crashes": 1000},
    )
    with EnvRunner(cfg) as runner:
        with pytest.raises(SubEnvError, match=r"sub-env \d: failed"):
            runner.sample(num_env_steps=100)
        for _ in range(2):  # each later call tries those sub-envs again: an error, not a hang
            with pytest.raises(
                SubEnvError, match=r"(?s)sub-env \d: failed to reset \d+ times in a row"
            ):
                runner.sample(num_env_steps=100)


def test_an_episode_past_max_episode_steps_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(
        "marl_runner.bench.envs:CheapEnv",
        num_envs=2,
        max_episode_steps=5,
        env_config={"num_agents": 2, "episode_len": 30},
    )
    with caplog.at_level(logging.WARNING), EnvRunner(cfg) as runner:
        runner.sample(num_env_steps=80)
    warnings = [r for r in caplog.records if "max_episode_steps=5" in r.getMessage()]
    assert len(warnings) == 1


def test_complete_episodes_without_a_step_limit_warns_of_an_episode_that_does_not_end(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sample() waits for such an episode and holds its rows: the user is told why, once."""
    monkeypatch.setattr(lifecycle, "UNLIMITED_EPISODE_WARNING_STEPS", 20)
    cfg = config(
        "marl_runner.bench.envs:CheapEnv", num_envs=2, batch_mode="complete_episodes",
        env_config={"num_agents": 2, "episode_len": 1000},
    )
    with caplog.at_level(logging.WARNING), EnvRunner(cfg) as runner:
        for _ in range(19):
            runner.step()
        assert not [r for r in caplog.records if "has not ended" in r.getMessage()]
        for _ in range(30):
            runner.step()
    warnings = [r.getMessage() for r in caplog.records if "has not ended" in r.getMessage()]
    assert len(warnings) == 1
    assert "after 20 env steps" in warnings[0] and "max_episode_steps" in warnings[0]


def test_a_stopped_runner_says_so() -> None:
    runner = EnvRunner(config("marl_runner.bench.envs:CheapEnv", num_envs=1))
    runner.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        runner.sample()


@pytest.mark.parametrize("defect", ["obs_out_of_space", "obs_object_array"])
def test_an_obs_outside_its_space_is_named_by_sub_env_and_agent_without_checks(
    defect: str,
) -> None:
    """(Found by probes.) check_env_outputs off: nothing looks at each obs as it arrives,
    so an obs the policy's connectors cannot take fails the round; the error then names
    the sub-env and agent that sent it and the space it was expected in, not only the
    connector (an object array failed in numpy, a bare TypeError); with
    check_env_outputs on, the vector env names it as it arrives."""
    cfg = config(
        "tests.envs.malformed_env:MalformedEnv", env_config={"defect": defect},
        policies={"shared": {"model": {"type": "mlp", "hidden": [8]}}},
    )
    with EnvRunner(cfg) as runner:
        with pytest.raises(EnvError) as raised:
            for _ in range(3):
                runner.step()
    message = str(raised.value)
    assert message.startswith(
        "sub-env 0: an obs for agent 'a0' does not fit its observation space Discrete(2): got "
    )
    assert "check_env_outputs: true" in message
    if defect == "obs_out_of_space":
        assert "ObsPreprocessorConnector" in message  # what failed on it


@pytest.mark.parametrize("part", ["logits", "value"])
def test_nan_model_outputs_are_refused_not_sampled(part: str) -> None:
    """(Found by a probe.) Weights gone NaN (a diverged run, or a checkpoint of one): the
    numpy argmax would draw action 0 on every row and store NaN log-probs and values.
    Instead the step raises, naming the policy, the output and a row's sub-env and agent."""
    import torch

    cfg = config("marl_runner.bench.envs.cheap_env:CheapEnv", env_config={"num_agents": 2})
    with EnvRunner(cfg) as runner:
        runner.step()
        model = runner.policy_map["shared"].model
        with torch.no_grad():
            (model.logits if part == "logits" else model.value).bias.fill_(float("nan"))
        with pytest.raises(ValueError) as raised:
            runner.step()
    name = "action_logp" if part == "logits" else "vf_preds"
    assert str(raised.value).startswith(
        f"policy 'shared': {name} is NaN on 4 of its 4 rows, the first one of sub-env 0, "
        "agent 'agent_0': the model's weights are NaN"
    )


def test_the_nan_check_reads_custom_policy_columns_row_by_row() -> None:
    """(Found in review.) A custom policy's outputs may be objects, or several values per
    row: objects are not checked, a [n, k] column is judged per row (and only rows that
    act count: a done row's input, its final obs, is checked as an obs)."""
    from connectors.data import AgentRows
    from marl_runner.sampling.policy_outputs import Evaluated, refuse_nan_outputs

    rows = AgentRows({"env_ids": np.arange(4), "agent_ids": ["a", "b", "c", "d"]})
    values = np.zeros((4, 3))
    values[2, 1] = np.nan
    logp = np.array([{}, {}, {}, {}], object)
    output = (np.zeros(4), [], {"action_logp": logp, "vf_preds": values})
    refuse_nan_outputs("p", Evaluated(np.array([0, 1, 3]), rows, output))  # row 2 is done
    with pytest.raises(ValueError, match=r"vf_preds is NaN on 1 of its 4 rows, the first one "
                       r"of sub-env 2, agent 'c'"):
        refuse_nan_outputs("p", Evaluated(None, rows, output))


class NaNFinalObsEnv(MultiAgentEnv):
    """Two agents; a1 ends at round 2, with a NaN final obs where ``nan`` is set; the episode
    is truncated at round 4."""

    def __init__(self, cfg: dict) -> None:
        self.possible_agents = ["a0", "a1"]
        space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.nan = cfg["nan"]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        return {agent: np.zeros(2, np.float32) for agent in self.possible_agents}, {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        obs = {agent: np.zeros(2, np.float32) for agent in actions}
        truncateds = {"__all__": self.t == 4}
        if self.t == 2:
            truncateds["a1"] = True
            if self.nan:
                obs["a1"] = np.full(2, np.nan, np.float32)
        return obs, dict.fromkeys(actions, 1.0), {"__all__": False}, truncateds, {}


register_env("test_nan_final_obs", NaNFinalObsEnv)
GAE = {"model": {"type": "mlp", "hidden": [8]}, "config": {"gae": {"gamma": 0.9, "lambda": 0.9}}}
RANDOM = {"policy_class": "marl_runner.policy:RandomPolicy"}


@pytest.mark.parametrize(
    ("own_policy", "policy"),
    [(False, GAE), (True, GAE), (False, RANDOM)],
    ids=["beside_a_live_agent", "alone", "random_policy"],
)
def test_a_nan_final_obs_is_refused_not_handed_out_as_new_obs(own_policy: bool, policy) -> None:
    """(Found by a probe.) A NaN final obs went into the batch as new_obs, and a truncated
    trajectory's GAE bootstrapped from it: NaN advantages on all its rows, no error. One
    rule whatever else the round holds: a1's final row beside a0's live one, alone in its
    policy's round (a1 with a policy of its own: no forward pass), or read by a policy whose
    outputs are never NaN (found in review)."""
    policies = {"p0": policy, "p1": policy} if own_policy else {"shared": policy}
    mapping = {"a0": "p0", "a1": "p1"} if own_policy else None
    cfg = config("test_nan_final_obs", num_envs=1, rollout_fragment_length=8,
                 env_config={"nan": True}, policies=policies, policy_mapping_fn=mapping)
    with EnvRunner(cfg) as runner, pytest.raises(
        ValueError, match=r"the final obs is NaN on 1 of its \d rows, the first one of sub-env "
        r"0, agent 'a1': the env gave an obs with NaN"
    ):
        runner.sample()


def test_final_obs_without_nan_sample_as_before() -> None:
    cfg = config("test_nan_final_obs", num_envs=1, rollout_fragment_length=8,
                 env_config={"nan": False}, policies={"p0": GAE, "p1": GAE},
                 policy_mapping_fn={"a0": "p0", "a1": "p1"})
    with EnvRunner(cfg) as runner:
        batch = runner.sample()
    check_batch_invariants(batch)
    assert not np.isnan(batch.policy_batches["p1"]["advantages"]).any()


def test_a_connector_failing_for_another_reason_is_not_blamed_on_the_obs() -> None:
    """(Found in review.) float64 obs for a float32 Box (connectors take them), or values
    past its bounds, are not what made a connector fail: its own error is raised."""
    import gymnasium as gym

    from connectors.data import AgentRows
    from connectors.errors import ConnectorError
    from marl_runner.sampling.obs_misfit import run_agent_pipeline

    def fails(rows: AgentRows) -> AgentRows:
        raise ConnectorError("the mask is 5 wide")

    space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    rows = AgentRows({
        "obs": [np.array([0.5, 0.5]), np.array([7.0, -3.0], np.float32)],
        "env_ids": np.arange(2), "agent_ids": ["a0", "a1"],
    })
    with pytest.raises(ConnectorError, match="the mask is 5 wide"):
        run_agent_pipeline(fails, rows, lambda agent: space)
    rows["obs"] = [np.array([0.5, 0.5]), np.zeros(3)]
    with pytest.raises(EnvError, match=r"sub-env 1: an obs for agent 'a1' does not fit"):
        run_agent_pipeline(fails, rows, lambda agent: space)
