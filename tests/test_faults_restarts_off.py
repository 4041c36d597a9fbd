"""Restarts off and a sub-env that stays broken: every sample() works or raises, in time.

A dead worker (os._exit, or killed after a hang past `sub_env_step_timeout_s`)
cannot be reset without restarts; a sync sub-env that crashes every episode
fails again each time. Either way `sample()` must never loop: each call
returns a batch or raises `SubEnvError` naming the sub-env, within about the
step timeout. (It used to spin forever from the fourth call on.)
"""

from __future__ import annotations

import time

import pytest

from marl_runner import Callbacks, EnvRunner, SubEnvError
from marl_runner.envs.errors import EnvError
from tests.runner_helpers import config

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

STEP_TIMEOUT_S = 0.5
#: A loaded 2-core machine may take this long for one call; a loop never ends.
CALL_LIMIT_S = STEP_TIMEOUT_S + 15.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("vectorize", "fault"),
    [("sync", "raise"), ("subprocess", "exit"), ("subprocess", "hang")],
)
def test_ten_samples_in_a_row_each_work_or_raise_in_time(tmp_path, vectorize, fault):
    env_config = {"crash_step": 3, "fault": fault, "hang_s": 30.0, "episode_len": 10}
    if vectorize == "subprocess":
        env_config["fault_token"] = str(tmp_path / "fault-token")  # one worker dies
    cfg = config(
        "tests.envs:CrashingEnv",
        env_config=env_config,
        vectorize=vectorize,
        num_envs=2,
        num_workers=2 if vectorize == "subprocess" else None,
        restart_failed_sub_environments=False,
        sub_env_step_timeout_s=STEP_TIMEOUT_S,
        seed=1,
    )
    outcomes = []
    with EnvRunner(cfg) as runner:
        for _ in range(10):
            start = time.monotonic()
            try:
                runner.sample()
                outcomes.append("ok")
            except SubEnvError as error:
                assert "sub-env" in str(error)
                outcomes.append("raised")
            assert time.monotonic() - start < CALL_LIMIT_S
    assert outcomes[0] == "raised"
    if vectorize == "subprocess":
        assert outcomes == ["raised"] * 10  # the dead worker's sub-env can never be reset


@pytest.mark.timeout(120)
def test_a_dead_workers_sub_envs_are_tried_once_then_raise_as_gone(tmp_path):
    """Worker 1 of two (sub-envs 2 and 3) hangs past the step timeout and is killed.
    Its two episodes and one reset each are faulty; later calls raise at once that the
    sub-env is gone, without trying (and counting) another reset."""
    env_config = {"crash_step": 3, "fault": "hang", "hang_s": 30.0, "episode_len": 10,
                  "fault_token": str(tmp_path / "fault-token")}
    cfg = config(
        "tests.envs:CrashingEnv", env_config=env_config, vectorize="subprocess",
        num_envs=4, num_workers=2, restart_failed_sub_environments=False,
        sub_env_step_timeout_s=STEP_TIMEOUT_S, seed=1,
    )
    with EnvRunner(cfg) as runner:
        with pytest.raises(SubEnvError, match="sub_env_step_timeout_s") as first:
            runner.sample()
        dead = {first.value.env_id, first.value.env_id ^ 1}  # it and its worker mate
        sent: list[set] = []
        send = runner.env.send_actions
        runner.env.send_actions = lambda actions: (sent.append(set(actions)), send(actions))[1]
        for _ in range(5):
            with pytest.raises(SubEnvError, match="is gone .* build a new runner") as later:
                runner.sample()
            assert later.value.env_id in dead
        metrics = runner.get_metrics()
    assert metrics["num_faulty_episodes"] == 4, metrics["faults"]
    assert sent and not any(env_ids & dead for env_ids in sent)  # nothing sent to them


@pytest.mark.timeout(60)
@pytest.mark.parametrize("vectorize", ["sync", "subprocess"])
def test_resets_that_raise_are_retried_each_call_never_a_loop(vectorize):
    # A reset that raises something other than SubEnvError (here a malformed reset
    # result) must leave the sub-envs not yet reset queued for the next step: each
    # call raises again, none spins forever.
    cfg = config(
        "tests.envs:MalformedEnv",
        env_config={"defect": "reset_obs_only"},
        vectorize=vectorize,
        num_envs=2,
        restart_failed_sub_environments=False,
    )
    counts = _EpisodeCounts()
    with EnvRunner(cfg, callbacks=counts) as runner:
        for _ in range(10):
            with pytest.raises((EnvError, SubEnvError), match="sub-env"):
                runner.sample()
    # A reset is tried in each later call; an episode whose reset raised is ended, as faulty.
    assert len(counts.created) >= 9
    assert counts.created <= counts.ended


class _EpisodeCounts(Callbacks):
    """The ids of the episodes created and of those ended (all faulty here)."""

    def __init__(self) -> None:
        self.created: set[int] = set()
        self.ended: set[int] = set()

    def on_episode_created(self, **kwargs) -> None:
        self.created.add(kwargs["episode"].episode_id)

    def on_episode_end(self, **kwargs) -> None:
        assert kwargs["episode"].faulty
        self.ended.add(kwargs["episode"].episode_id)
