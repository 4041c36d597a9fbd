"""Progress from Python (``marl_runner.progress.sample_with_progress``), the CLI's display."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.progress import sample_with_progress

CHEAP = {
    "env": {
        "name": "marl_runner.bench.envs.cheap_env:CheapEnv",
        "config": {"num_agents": 3, "episode_len": 7},
    },
    "num_envs": 2,
    "rollout_fragment_length": 5,
    "policies": {"shared": {"model": {"hidden": [8]}}},
}


def test_sample_with_progress_returns_the_steps_and_shows_them() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False)
    with EnvRunner(RunnerConfig.from_dict(CHEAP)) as runner:
        batch = sample_with_progress(runner, 25, console=console, interval_s=0)
    assert batch.env_steps() == 30  # three samples of one 5-step fragment per sub-env
    assert len(batch.policy_batches["shared"]) == 90
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("sampling: 10/25 env steps (40%), ")
    assert lines[-1].startswith("sampling: 30/25 env steps (100%), ")
    assert "episodes" not in lines[-1]  # an EnvRunner's episodes belong to its get_metrics()


def test_sample_with_progress_counts_agent_steps_in_a_live_bar() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with EnvRunner(RunnerConfig.from_dict(CHEAP)) as runner:
        batch = sample_with_progress(runner, num_agent_steps=40, console=console)
    assert len(batch.policy_batches["shared"]) == 60
    text = buffer.getvalue()
    assert "40/40" in text and "env steps/s" in text and "episodes" not in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of num_env_steps and num_agent_steps"),
        ({"num_env_steps": 5, "num_agent_steps": 5}, "exactly one"),
        ({"num_env_steps": 0}, "env_steps must be an integer >= 1, got 0"),
    ],
)
def test_sample_with_progress_bad_targets(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sample_with_progress(object(), **kwargs)


def test_config_and_progress_import_without_torch() -> None:
    code = (
        "import sys, marl_runner.config, marl_runner.progress, marl_runner.cli.common; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
