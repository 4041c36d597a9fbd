"""TensorBoardCallbacks: the scalars read back from the event files are what
``get_metrics()`` reported for the same samples of a real PettingZoo env."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.tensorboard import TensorBoardCallbacks

pytest.importorskip("tensorboard", reason="needs the extra: pip install 'marl-runner[tensorboard]'")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TICTACTOE = REPO / "examples" / "configs" / "tictactoe.yaml"
SIMPLE_SPREAD = REPO / "examples" / "configs" / "simple_spread.yaml"
# Counts and means both runs compute from the same episodes; rates depend on timing.
SAME_KEYS = (
    "episodes",
    "num_faulty_episodes",
    "num_late_rewards",
    "episode_reward_mean",
    "episode_reward_min",
    "episode_reward_max",
    "episode_len_mean",
    "num_env_steps",
    "num_agent_steps",
)


class MovesMetric(TensorBoardCallbacks):
    """A user's own hook: a custom metric set before the logger notes the episode."""

    def on_episode_end(self, *, episode: Any, **kwargs: Any) -> None:
        episode.custom_metrics["moves"] = float(episode.length)
        super().on_episode_end(episode=episode, **kwargs)


def small(path: Path, num_envs: int = 2) -> RunnerConfig:
    return RunnerConfig.from_yaml(path).with_overrides([f"num_envs={num_envs}"])


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


@pytest.mark.parametrize(
    ("config_path", "policy_ids"),
    [(TICTACTOE, ("player_1", "player_2")), (SIMPLE_SPREAD, ("shared",))],
    ids=["tictactoe", "simple_spread"],
)
def test_scalars_equal_what_get_metrics_reported(tmp_path, config_path, policy_ids) -> None:
    """Tic-tac-toe: two seats (zero-sum, so each episode's total is 0); simple_spread:
    one shared policy with negative episode rewards."""
    logger = MovesMetric(tmp_path / "tb")
    reported, steps = [], []
    with EnvRunner(small(config_path), callbacks=logger) as runner:
        for _ in range(3):
            batch = runner.sample()
            steps.append((steps[-1] if steps else 0) + batch.env_steps())
            reported.append(runner.get_metrics())
    logger.close()
    assert logger.env_steps == steps[-1]
    scalars = read_scalars(tmp_path / "tb")
    expected_tags = {*SAME_KEYS, "env_steps_per_s", "agent_steps_per_s", "custom_metrics/moves"}
    expected_tags |= {f"policy_reward_mean/{p}" for p in policy_ids}
    assert set(scalars) == expected_tags
    for key in SAME_KEYS:
        assert scalars[key] == [
            (step, pytest.approx(m[key], rel=1e-6)) for step, m in zip(steps, reported)
        ], key
    for policy_id in policy_ids:
        assert [v for _, v in scalars[f"policy_reward_mean/{policy_id}"]] == pytest.approx(
            [m["policy_reward_mean"][policy_id] for m in reported], rel=1e-6
        )
    moves = [v for _, v in scalars["custom_metrics/moves"]]
    assert moves == pytest.approx([m["custom_metrics"]["moves"] for m in reported], rel=1e-6)
    assert moves == pytest.approx([m["episode_len_mean"] for m in reported], rel=1e-6)
    assert all(value > 0 for _, value in scalars["agent_steps_per_s"])
    assert all(m["episodes"] > 0 for m in reported)  # every sample had episodes to compare


def test_step_by_agent_steps_and_a_copy_writes_its_own_file(tmp_path) -> None:
    logger = TensorBoardCallbacks(tmp_path, step_by="agent_steps")
    with EnvRunner(small(TICTACTOE, num_envs=1), callbacks=logger) as runner:
        first = runner.sample().agent_steps()
        copy = pickle.loads(pickle.dumps(logger))  # as sent to another process
        second = runner.sample().agent_steps()
    logger.close()
    assert copy.writer is not logger.writer
    copy.close()
    assert [step for step, _ in read_scalars(tmp_path)["num_agent_steps"]] == [
        first,
        first + second,
    ]
    with pytest.raises(ValueError, match="step_by 'episodes'"):
        TensorBoardCallbacks(tmp_path, step_by="episodes")


def test_without_tensorboard_the_error_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'marl-runner\[tensorboard\]'"):
        TensorBoardCallbacks()


def test_importing_the_module_does_not_import_tensorboard() -> None:
    code = (
        "import sys, marl_runner.tensorboard; "
        "assert not {'tensorboard', 'torch.utils.tensorboard'} & set(sys.modules), 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
