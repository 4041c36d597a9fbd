"""The marl-runner CLI: validate, sample (with a stand-in runner and the real one), bench."""

from __future__ import annotations

import argparse
import dataclasses
import io
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml
from rich.console import Console

import marl_runner
import marl_runner.cli.sample
import marl_runner.sampling.runner
from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.cli import build_parser, main
from marl_runner.cli.display import SampleCounts, make_progress, metrics_table
from marl_runner.config import RunnerConfig
from marl_runner.io import read_batches, write_batch

REPO = Path(__file__).parent.parent
EXAMPLES = REPO / "examples" / "configs"
BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps tables at the terminal width; keep space reprs on one line."""
    monkeypatch.setenv("COLUMNS", "250")


def write_config(tmp_path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "env": {"name": "fake_env"},
        "num_envs": 2,
        "rollout_fragment_length": 10,
        "policies": {"archer": {}, "knight": {}},
        "policy_mapping_fn": {"archer_*": "archer", "knight_*": "knight"},
    }
    data.update(changes)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def assert_one_line_error(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], lines[0]


# ----------------------------------------------------------------------------- parser


def test_every_flag_has_help() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = {"sample", "validate", "serve", "evaluate", "plot", "config-doc"}
    assert set(subparsers.choices) == commands | {"bench"}
    for name in commands:
        for action in subparsers.choices[name]._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    for choice in subparsers._choices_actions:
        assert choice.help


@pytest.mark.parametrize(
    "argv",
    [
        ["sample", "c.yaml", "--steps", "0"],
        ["sample", "c.yaml", "--steps", "10", "--episodes", "2"],
        ["sample", "c.yaml", "--unknown"],
        ["serve", "c.yaml", "--episodes", "0"],
        ["serve", "c.yaml", "--steps", "5", "--episodes", "2"],
        ["sample", "c.yaml", "--metrics-interval", "-1"],
        ["sample", "c.yaml", "--metrics-interval", "nan"],
        ["serve", "c.yaml", "--metrics-interval", "soon"],
        ["plot"],
        ["validate"],
        [],
    ],
)
def test_bad_command_lines_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sample", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--steps" in out and "--episodes" in out and "--out" in out and "--set" in out


# validate: tests/test_cli_validate.py (a real env, since validate builds a runner)


# ----------------------------------------------------------------------------- sample (stand-in runner)


def fake_batch(env_steps: int) -> MultiAgentBatch:
    infos = np.empty(2, dtype=object)
    infos[:] = [{}, {"step": env_steps}]
    archer = SampleBatch(
        obs=np.zeros((2, 3), np.float32), rewards=np.ones(2, np.float32), infos=infos
    )
    return MultiAgentBatch({"archer": archer}, env_steps=env_steps)


FAKE_METRICS = {
    "episodes": 2,
    "episode_reward_mean": 1.5,
    "episode_len_mean": 5.0,
    "policy_reward_mean": {"archer": 1.0, "knight": 0.5},
    "num_faulty_episodes": 1,
    "num_env_steps": 30,
    "num_agent_steps": 60,
    "env_steps_per_s": 1234.5,
    "agent_steps_per_s": 2469.0,
    "perf": {"mean_inference_ms": 0.25, "mean_env_wait_ms": 0.5},
}


@dataclasses.dataclass
class FakeSample:
    """One scripted ``sample()``: a batch of ``env_steps`` rows' worth, and the episodes
    (good and faulty) that ended during it, reported by the next ``get_metrics()``."""

    env_steps: int = 10
    episodes: int = 0
    faulty: int = 0

    def metrics(self) -> dict[str, Any]:
        ended = dict.fromkeys(("episode_reward_mean", "episode_len_mean"), float("nan"))
        if self.episodes:
            ended = {"episode_reward_mean": 1.5, "episode_len_mean": 5.0}
        return {
            **ended,
            "episodes": self.episodes,
            "num_faulty_episodes": self.faulty,
            "policy_reward_mean": {"archer": 1.0, "knight": 0.5} if self.episodes else {},
            "num_env_steps": self.env_steps,
            "num_agent_steps": 2,
            "env_steps_per_s": 1e9,  # a runner's own rate: the group recomputes it
            "agent_steps_per_s": 1e9,
            "perf": {"mean_inference_ms": 0.25, "mean_env_wait_ms": 0.5},
        }


class FakeRunner:
    """Stands in for ``EnvRunner`` where EnvRunnerGroup builds its local runner:
    replays a script of ``sample()`` outcomes (a FakeSample or an exception to
    raise) and records its life cycle."""

    script: list[FakeSample | BaseException] = []
    #: What ``flush()`` hands out: the rows sampled and not yet in a batch (None: none).
    rest: FakeSample | None = None
    instances: list[FakeRunner] = []

    def __init__(self, config: RunnerConfig, **kwargs: Any) -> None:
        self.config = config
        self.kwargs = kwargs  # what the group passes on: the CLI's checked mapping
        self.calls = 0
        self.stopped = False
        self.policy_map: dict[str, Any] = {}  # no observation filters to sync
        self._unreported: dict[str, Any] = {}
        FakeRunner.instances.append(self)

    def sample(self) -> MultiAgentBatch:
        assert not self.stopped, "sample() after stop()"
        item = self.script[self.calls % len(self.script)]
        self.calls += 1
        if isinstance(item, BaseException):
            raise item
        self._unreported = item.metrics()
        return fake_batch(item.env_steps)

    def request_stop(self) -> None:
        self.stop_requested = True

    def flush(self) -> MultiAgentBatch:
        """Like EnvRunner: ``rest`` once, then nothing."""
        rest, FakeRunner.rest = self.rest, None
        if rest is None:
            return MultiAgentBatch({}, env_steps=0)
        self._unreported = rest.metrics()
        return fake_batch(rest.env_steps)

    def get_metrics(self) -> dict[str, Any]:
        """Like EnvRunner: what happened since the last call."""
        metrics, self._unreported = self._unreported, {}
        return metrics

    def get_state(self) -> dict[str, Any]:
        return {}

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeRunner]]:
    """EnvRunnerGroup builds its runner from ``marl_runner.sampling.runner``: the fake goes
    there (and to ``marl_runner.EnvRunner``), and monkeypatch puts the real one back after
    the test."""
    monkeypatch.setattr(marl_runner.sampling.runner, "EnvRunner", FakeRunner)
    monkeypatch.setattr(marl_runner, "EnvRunner", FakeRunner)
    # sample builds one sub-env to estimate its batch's memory; the fake has no env.
    monkeypatch.setattr(marl_runner.cli.sample, "probe_agents", lambda *_: ([], False))
    FakeRunner.instances = []
    FakeRunner.rest = None
    FakeRunner.script = [FakeSample(), FakeSample(episodes=1), FakeSample(faulty=1)]
    yield FakeRunner
    assert all(runner.stopped for runner in FakeRunner.instances)


def table_value(out: str, metric: str) -> str:
    """The value cell of ``metric``'s row in the printed metrics table."""
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
        if len(cells) == 2 and cells[0] == metric:
            return cells[1]
    raise AssertionError(f"no row {metric!r} in:\n{out}")


def test_sample_writes_batches_and_prints_metrics(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    path = write_config(tmp_path)
    code = main(
        ["sample", str(path), "--steps", "25", "--out", str(out_dir), "--set", "num_envs=3"]
    )
    assert code == 0
    runner = fake_runner.instances[0]
    assert runner.config.num_envs == 3 and runner.stopped
    batches = list(read_batches(out_dir))
    assert [b.env_steps() for b in batches] == [10, 10, 10]  # stops at the first batch past 25
    assert batches[2].policy_batches["archer"]["infos"][1] == {"step": 10}
    assert sorted(p.name for p in out_dir.iterdir()) == [
        ".marl-runner.lock",  # (empty: its lock said a run wrote there)
        "batch_000001.npz",
        "batch_000002.npz",
        "batch_000003.npz",
        "config.yaml",
    ]
    assert RunnerConfig.from_yaml(out_dir / "config.yaml") == runner.config
    out = capsys.readouterr().out
    # The group's metrics: the three samples' metrics merged.
    assert table_value(out, "episodes") == "1" and table_value(out, "faulty episodes") == "1"
    assert table_value(out, "episode_reward_mean") == "1.500"
    assert table_value(out, "policy_reward_mean[knight]") == "0.500"
    assert table_value(out, "env steps") == "30" and table_value(out, "agent steps") == "6"
    assert table_value(out, "perf mean_inference_ms") == "0.250"
    assert "1,000,000,000" not in table_value(out, "env steps/s")  # the group's own rate
    assert "wrote 3 batches" in out


def test_sample_default_target_is_one_fragment_per_sub_env(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sample", str(write_config(tmp_path)), "--progress-interval", "0"]) == 0
    assert "20/20 env steps (100%)" in capsys.readouterr().out  # num_envs 2 * fragment 10


def test_sample_default_target_counts_as_the_config_does(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, count_steps_by="agent_steps")
    assert main(["sample", str(path), "--progress-interval", "0"]) == 0
    assert "20/20 agent steps (100%)" in capsys.readouterr().out


def test_sample_counts_episodes_without_faulty_ones(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["sample", str(write_config(tmp_path)), "--episodes", "2", "--progress-interval", "0"])
        == 0
    )
    assert fake_runner.instances[0].calls == 5  # episodes end in samples 2 and 5, a faulty one in 3
    out = capsys.readouterr().out
    assert "sampling: 1/2 episodes (50%), 1 episodes," in out
    assert "sampling: 2/2 episodes (100%), 2 episodes (1 faulty)," in out


def test_sample_counts_agent_steps(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "sample",
        str(write_config(tmp_path)),
        "--steps",
        "3",
        "--count-steps-by",
        "agent_steps",
    ]
    assert main([*args, "--progress-interval", "0"]) == 0
    assert "4/3 agent steps (100%)" in capsys.readouterr().out  # two batches of 2 rows


@pytest.mark.parametrize("left", ["npz", "parquet", "parquet_without_its_manifest"])
def test_sample_refuses_out_dir_with_batches(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str], left: str
) -> None:
    """Also the data files of a Parquet batch whose manifest a killed run never wrote:
    the directory was taken, and the first write failed after sampling."""
    written = write_batch(fake_batch(1), tmp_path / "out", 1, format=left[:7].rstrip("_"))
    if left == "parquet_without_its_manifest":
        written.unlink()
    assert main(["sample", str(write_config(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    assert_one_line_error(capsys.readouterr().err, "already holds batch files")
    assert not fake_runner.instances


def test_sample_runtime_error_is_one_line(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_runner.script = [FakeSample(), RuntimeError("sub-env 3 exploded")]
    assert main(["sample", str(write_config(tmp_path))]) == 1
    assert_one_line_error(
        capsys.readouterr().err, "marl-runner sample: error: RuntimeError: sub-env 3 exploded"
    )
    assert fake_runner.instances[0].stopped


def test_sample_interrupt_prints_partial_metrics(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_runner.script = [FakeSample(episodes=1), KeyboardInterrupt()]
    out_dir = tmp_path / "out"
    args = ["sample", str(write_config(tmp_path)), "--steps", "100", "--out", str(out_dir)]
    assert main(args) == 130
    out = capsys.readouterr().out
    assert table_value(out, "episodes") == "1"
    assert table_value(out, "episode_reward_mean") == "1.500"
    assert "interrupted" in out and "wrote 1 batch (" in out
    assert [b.env_steps() for b in read_batches(out_dir)] == [10]
    assert fake_runner.instances[0].stopped


def test_sample_bad_config_exits_2(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sample", str(write_config(tmp_path, batch_mode="episodes"))]) == 2
    assert_one_line_error(
        capsys.readouterr().err, "batch_mode: got 'episodes'", "'complete_episodes'"
    )
    assert not fake_runner.instances


# ----------------------------------------------------------------------------- sample (real runner)


def test_sample_tictactoe_with_the_real_runner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    args = ["sample", str(EXAMPLES / "tictactoe.yaml"), "--steps", "120", "--out", str(out_dir)]
    assert main([*args, "--set", "num_envs=2", "--set", "rollout_fragment_length=20"]) == 0
    batches = list(read_batches(out_dir))
    assert sum(b.env_steps() for b in batches) >= 120
    assert all(set(b.policy_batches) <= {"player_1", "player_2"} for b in batches)
    out = capsys.readouterr().out
    assert "episode_len_mean" in out and "env steps/s" in out


def test_sample_episodes_with_the_real_runner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sample", str(EXAMPLES / "connect_four.yaml"), "--episodes", "3", "--set", "num_envs=2"]
    assert main([*args, "--progress-interval", "0"]) == 0
    out = capsys.readouterr().out
    # Each sample() call brings every sub-env's next episode, and one sub-env may finish
    # several meanwhile: sampling stops at the first call that reaches the target.
    counts = [int(n) for n in re.findall(r"(\d+)/3 episodes", out)]
    assert counts and counts[-1] >= 3 and all(n < 3 for n in counts[:-1])


# ----------------------------------------------------------------------------- bench


def test_bench_forwards_all_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[list[str]] = []
    module = types.ModuleType("marl_runner.bench.cli")
    module.main = lambda argv: received.append(argv) or 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "marl_runner.bench.cli", module)
    assert main(["bench", "--steps", "10", "kaz", "-h"]) == 3
    assert received == [["--steps", "10", "kaz", "-h"]]


# ----------------------------------------------------------------------------- display


def test_plain_progress_lines_are_throttled() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False)
    counts = SampleCounts()
    with make_progress(100, "env_steps", console, interval_s=3600) as progress:
        for _ in range(5):
            counts.env_steps += 20
            progress.update(counts)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2  # the first update, then the final state on exit
    assert lines[0].startswith("sampling: 20/100 env steps (20%)")
    assert lines[1].startswith("sampling: 100/100 env steps (100%)")


def test_live_bar_in_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200)
    counts = SampleCounts(env_steps=50, episodes=3)
    with make_progress(100, "env_steps", console) as progress:
        progress.update(counts)
    text = buffer.getvalue()
    assert "50/100" in text and "3 episodes" in text and "env steps/s" in text


def test_metrics_table_with_no_finished_episode() -> None:
    buffer = io.StringIO()
    metrics = dict(
        FAKE_METRICS, episodes=0, episode_reward_mean=float("nan"), policy_reward_mean={}
    )
    Console(file=buffer, width=120).print(metrics_table(metrics))
    assert "n/a" in buffer.getvalue()


def test_metrics_table_lists_custom_metrics(capsys: pytest.CaptureFixture) -> None:
    assert (
        main(
            [
                "sample",
                "examples/configs/kaz_custom_metrics.yaml",
                "--episodes",
                "2",
                "--set",
                "env.config.max_cycles=40",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for name in ("archer_kills", "knight_kills", "agents_lost"):
        assert f"custom_metrics[{name}]" in out


def test_progress_line_and_table_report_one_throughput(
    tmp_path: Path, fake_runner: type[FakeRunner], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: the progress line and the final table count the same steps over the same
    time (the batches' steps; the sampling time, runner build excluded)."""
    fake_runner.script = [FakeSample(env_steps=10)]  # batches of 10 env steps, 2 agent steps
    args = ["sample", str(write_config(tmp_path)), "--steps", "40", "--progress-interval", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    last = [line for line in out.splitlines() if line.startswith("sampling:")][-1]
    assert last.startswith("sampling: 40/40 env steps (100%)")
    env_rate = re.search(r"([\d,]+) env steps/s", last).group(1)
    agent_rate = re.search(r"([\d,]+) agent steps/s", last).group(1)
    assert table_value(out, "env steps") == "40" and table_value(out, "agent steps") == "8"
    assert table_value(out, "env steps/s") == env_rate
    assert table_value(out, "agent steps/s") == agent_rate
    assert "(runner build excluded), as in the progress line" in " ".join(out.split())


def test_sample_counts_rates_over_the_sampling_time() -> None:
    counts = SampleCounts(env_steps=300, agent_steps=900, elapsed_s=1.5)
    assert counts.env_steps_per_s() == 200.0 and counts.agent_steps_per_s() == 600.0
    assert SampleCounts().env_steps_per_s() == 0.0
