"""`marl-runner sample/serve --metrics-out`: one JSON record per interval that adds up to
exactly what was sampled, complete on a normal end, on Ctrl-C and on an error."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import marl_runner.cli.sample as cli_sample
from marl_runner import Callbacks, EnvRunner
from marl_runner.bench.envs.cheap_env import CheapEnv
from marl_runner.checks import check_batch_invariants
from marl_runner.cli import main
from marl_runner.cli.common import BatchFileWriter
from marl_runner.client import PolicyClient
from marl_runner.io import read_batches
from marl_runner.metrics_log import read_metrics_log
from marl_runner.sampling.fragments import FragmentBuilder

REPO = Path(__file__).resolve().parents[1]
SIMPLE_SPREAD = REPO / "examples" / "configs" / "simple_spread.yaml"
TICTACTOE = REPO / "examples" / "configs" / "tictactoe.yaml"
DRONES = REPO / "examples" / "configs" / "serve_drones.yaml"
# 2 sub-envs x 100 env steps (300 agent steps of 3 agents) per sample: 200 env steps a batch.
SMALL = ["--set", "num_envs=2"]


class InterruptOnThirdSample(Callbacks):
    """Ctrl-C in the middle of the third ``sample()``, as a user pressing it would."""

    def __init__(self) -> None:
        self.samples = 0

    def on_sample_end(self, **kwargs: Any) -> None:
        self.samples += 1
        if self.samples == 3:
            raise KeyboardInterrupt


class CtrlCMidSample(Callbacks):
    """A first Ctrl-C in the middle of the third ``sample()``: when its 20th episode ends
    (2 sub-envs end an episode together every 25 rounds, 8 per sample), at round 50."""

    signum = signal.SIGINT

    def __init__(self) -> None:
        self.episodes = 0

    def on_episode_end(self, **kwargs: Any) -> None:
        self.episodes += 1
        if self.episodes == 20:
            os.kill(os.getpid(), self.signum)


class TerminateMidSample(CtrlCMidSample):
    """SIGTERM there instead, as a scheduler's stop."""

    signum = signal.SIGTERM


class CtrlCTwiceMidSample(CtrlCMidSample):
    """Ctrl-C twice there: the second stops the command at once (an env that hangs)."""

    def on_episode_end(self, **kwargs: Any) -> None:
        super().on_episode_end(**kwargs)
        if self.episodes == 20:
            os.kill(os.getpid(), self.signum)
            time.sleep(5)  # the handler raises at once
            raise AssertionError("the second Ctrl-C did not stop the command")


class FailOnThirdSample(InterruptOnThirdSample):
    def on_sample_end(self, **kwargs: Any) -> None:
        self.samples += 1
        if self.samples == 3:
            raise RuntimeError("the third sample broke")


def batch_steps(out_dir: Path) -> tuple[int, int]:
    batches = list(read_batches(out_dir))
    return sum(b.env_steps() for b in batches), sum(b.agent_steps() for b in batches)


def check_records_add_up(records: list[dict[str, Any]], env_steps: int, agent_steps: int) -> None:
    """The intervals' counts sum to the run's; the cumulative counts climb to the same."""
    assert records, "no records"
    assert sum(r["num_env_steps"] for r in records) == env_steps
    assert sum(r["num_agent_steps"] for r in records) == agent_steps
    assert np.cumsum([r["num_env_steps"] for r in records]).tolist() == [
        r["env_steps"] for r in records
    ]
    assert records[-1]["env_steps"] == env_steps and records[-1]["agent_steps"] == agent_steps
    elapsed = [r["elapsed_s"] for r in records]
    assert elapsed == sorted(elapsed)


def test_a_record_per_batch_adds_up_to_the_batches_written(tmp_path, capsys) -> None:
    log = tmp_path / "logs" / "metrics.jsonl"  # its missing parent is created
    out = tmp_path / "out"
    code = main(
        [
            "sample",
            str(SIMPLE_SPREAD),
            "--steps",
            "1000",
            *SMALL,
            "--out",
            str(out),
            "--metrics-out",
            str(log),
            "--metrics-interval",
            "0",
        ]
    )
    stdout = capsys.readouterr().out
    assert code == 0
    records = read_metrics_log(log)
    env_steps, agent_steps = batch_steps(out)
    assert env_steps == 1000 and len(records) == 5  # one record per 200-step batch
    check_records_add_up(records, env_steps, agent_steps)
    assert f"wrote 5 metrics records to {log}" in stdout
    # simple_spread's episodes last 25 steps: 8 end in every batch of 2 x 100 steps.
    assert [r["episodes"] for r in records] == [8] * 5
    assert all(r["episode_len_mean"] == 25.0 for r in records)
    assert all(r["policy_reward_mean"]["shared"] == r["episode_reward_mean"] for r in records)
    # The end-of-run table covers the whole run, not the last interval.
    run_mean = np.mean([r["episode_reward_mean"] for r in records])
    assert re.search(r"episodes\s*│\s*40\b", stdout)
    assert f"{run_mean:.3f}" in stdout


def test_a_long_interval_still_leaves_one_record_for_the_whole_run(tmp_path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"from": "an earlier run"}\n')  # replaced, not appended to
    out = tmp_path / "out"
    argv = [
        "sample",
        str(TICTACTOE),
        "--steps",
        "200",
        "--set",
        "num_envs=2",
        "--out",
        str(out),
        "--metrics-out",
        str(log),
        "--metrics-interval",
        "3600",
    ]
    assert main(argv) == 0
    (record,) = read_metrics_log(log)
    env_steps, agent_steps = batch_steps(out)
    check_records_add_up([record], env_steps, agent_steps)
    assert record["episodes"] > 0 and set(record["policy_reward_mean"]) == {"player_1", "player_2"}
    # Tic-tac-toe is zero-sum: what one seat wins the other loses.
    rewards = record["policy_reward_mean"]
    assert math.isclose(rewards["player_1"], -rewards["player_2"], abs_tol=1e-9)


@pytest.mark.parametrize(("callbacks", "exit_code"), [("CtrlCMidSample", 130), ("TerminateMidSample", 143)])
def test_ctrl_c_or_sigterm_writes_every_finished_episode(tmp_path, capsys, callbacks, exit_code) -> None:
    """The third sample returns at the end of the round in which the signal came, with
    its rows so far (a fragment cut short): every finished episode is on disk, and the
    log, the files and the summary agree."""
    log, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    code = main(
        [
            "sample", str(SIMPLE_SPREAD), "--steps", "100000", *SMALL, "--out", str(out),
            "--set", f"callbacks=tests.test_cli_metrics_out:{callbacks}",
            "--metrics-out", str(log), "--metrics-interval", "0",
        ]
    )
    captured = capsys.readouterr()
    assert code == exit_code, captured.err
    assert "interrupted" in captured.out and "Traceback" not in captured.err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the command's handlers are gone
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    batches = list(read_batches(out))
    assert [b.env_steps() for b in batches] == [200, 200, 100]
    for batch in batches:
        check_batch_invariants(batch)
    shared = [b.policy_batches["shared"] for b in batches]
    last_rows = sum(int(np.sum(b["terminateds"] | b["truncateds"])) for b in shared)
    assert last_rows == 20 * 3  # 20 episodes of 3 agents, each to its end
    records = read_metrics_log(log)
    assert sum(r["episodes"] for r in records) == 20
    check_records_add_up(records, *batch_steps(out))
    assert "wrote 3 batches (20 episodes, 500 env steps)" in captured.out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_while_the_last_batch_is_written_waits_for_it(
    tmp_path, capfd, monkeypatch, signum
) -> None:
    """A double tap whose second Ctrl-C (or SIGTERM) lands while the batch of the rows
    sampled so far is written: that batch used to be lost, finished episodes and all,
    without a word. The write now ends first; the run stops as the first signal asked."""
    write = BatchFileWriter.write

    def write_with_a_second_signal(self, batch, index):
        if index == 3:
            os.kill(os.getpid(), signum)
            time.sleep(0.1)  # the handler runs here
        return write(self, batch, index)

    monkeypatch.setattr(BatchFileWriter, "write", write_with_a_second_signal)
    out = tmp_path / "out"
    first = "CtrlCMidSample" if signum == signal.SIGINT else "TerminateMidSample"
    code = main(
        [
            "sample", str(SIMPLE_SPREAD), "--steps", "100000", *SMALL, "--out", str(out),
            "--set", f"callbacks=tests.test_cli_metrics_out:{first}",
        ]
    )
    captured = capfd.readouterr()  # (the signal handler writes to fd 2 itself)
    assert code == (130 if signum == signal.SIGINT else 143), captured.err
    assert [b.env_steps() for b in read_batches(out)] == [200, 200, 100]
    assert "still writing what was sampled" in captured.err
    assert "wrote 3 batches (20 episodes, 500 env steps)" in captured.out


def test_a_third_signal_while_the_last_batch_is_written_says_it_was_lost(
    tmp_path, monkeypatch, caplog
) -> None:
    """One more Ctrl-C stops the write at once, as asked: the batch is lost, and the log
    says so (the summary counts only what was written)."""
    write = BatchFileWriter.write

    def write_with_two_more_signals(self, batch, index):
        if index == 3:
            for _ in range(2):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)  # the handler runs here
        return write(self, batch, index)

    monkeypatch.setattr(BatchFileWriter, "write", write_with_two_more_signals)
    out = tmp_path / "out"
    code = main(
        [
            "sample", str(SIMPLE_SPREAD), "--steps", "100000", *SMALL, "--out", str(out),
            "--set", "callbacks=tests.test_cli_metrics_out:CtrlCMidSample",
        ]
    )
    assert code == 130
    assert [b.env_steps() for b in read_batches(out)] == [200, 200]
    assert "the rows sampled since the last batch not written: KeyboardInterrupt" in caplog.text


def test_a_second_signal_while_the_last_batch_is_built_waits_for_it(tmp_path, monkeypatch) -> None:
    """The build of the rows sampled since the last fragment (GAE, say) runs after the
    first signal's round: a second Ctrl-C there lost the batch (an interrupted build loses
    its fragment). It is now built where the write is, so the signal waits for both."""
    request_stop, build = EnvRunner.request_stop, FragmentBuilder._build
    asked, second_sent = [], []

    def noted_request_stop(self, *args, **kwargs):
        asked.append(True)
        return request_stop(self, *args, **kwargs)

    def build_with_a_second_signal(self, *args, **kwargs):
        if asked and not second_sent:
            second_sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs here
        return build(self, *args, **kwargs)

    monkeypatch.setattr(EnvRunner, "request_stop", noted_request_stop)
    monkeypatch.setattr(FragmentBuilder, "_build", build_with_a_second_signal)
    out = tmp_path / "out"
    code = main(
        [
            "sample", str(SIMPLE_SPREAD), "--steps", "100000", *SMALL, "--out", str(out),
            "--set", "callbacks=tests.test_cli_metrics_out:CtrlCMidSample",
        ]
    )
    assert code == 130 and second_sent
    assert [b.env_steps() for b in read_batches(out)] == [200, 200, 100]


@pytest.mark.parametrize(
    ("callbacks", "exit_code", "env_steps"),
    [("CtrlCTwiceMidSample", 130, 450), ("InterruptOnThirdSample", 130, 600), ("FailOnThirdSample", 1, 600)],
)
def test_a_hard_interrupt_or_an_error_leaves_a_complete_log(
    tmp_path, capsys, callbacks, exit_code, env_steps
) -> None:
    """The third sample never returns. A second Ctrl-C stops at once, and what the runner
    holds is still written: the first two batches, and of the third sample the 25 rounds
    of both sub-envs' episodes that ended before the interrupted round (the two that
    ended in that round are dropped with it). A Ctrl-C or an error out of the sample's end
    is reported after what it had built is written (three whole batches). The log and the
    batch files agree, the summary says how it ended."""
    log, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    code = main(
        [
            "sample",
            str(SIMPLE_SPREAD),
            "--steps",
            "100000",
            *SMALL,
            "--out",
            str(out),
            "--set",
            f"callbacks=tests.test_cli_metrics_out:{callbacks}",
            "--metrics-out",
            str(log),
            "--metrics-interval",
            "0",
        ]
    )
    captured = capsys.readouterr()
    err = captured.err
    assert code == exit_code, err
    if exit_code == 1:
        assert "RuntimeError: the third sample broke" in err
    else:
        assert "interrupted" in captured.out and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the command's handler is gone
    assert log.read_text().endswith("}\n")
    records = read_metrics_log(log)
    assert len(records) == 3
    on_disk_env_steps, on_disk_agent_steps = batch_steps(out)
    assert on_disk_env_steps == env_steps
    if callbacks == "CtrlCTwiceMidSample":
        # The log counts what was sampled: the two dropped episodes' 25 rounds too.
        sampled = records[-1]["agent_steps"]
        assert sampled > on_disk_agent_steps
        check_records_add_up(records, on_disk_env_steps + 2 * 25, sampled)
    else:
        check_records_add_up(records, on_disk_env_steps, on_disk_agent_steps)


class CrashesAtStep55(CheapEnv):
    """CheapEnv whose sub-envs raise in their 55th step: in the 6th episode of 10 rounds."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, actions: dict) -> Any:
        self.steps += 1
        if self.steps == 55:
            raise RuntimeError("the env broke")
        return super().step(actions)


def test_a_crashing_env_leaves_every_finished_episode_on_disk(tmp_path, capsys) -> None:
    """Restarts off: the crash ends the command with its error (exit 1), after the rows of
    the fragments begun (100 rounds long, none complete) are written: 5 whole episodes per
    sub-env."""
    config, out = tmp_path / "crash.yaml", tmp_path / "out"
    config.write_text(
        "env: {name: 'tests.test_cli_metrics_out:CrashesAtStep55', api: multi_agent,"
        " config: {num_agents: 2, episode_len: 10}}\n"
        "num_envs: 2\nrollout_fragment_length: 100\n"
        "policies: {shared: {model: {type: mlp, hidden: [8]}}}\n"
    )
    code = main(["sample", str(config), "--steps", "1000", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "sub-env 0" in err and "the env broke" in err, err
    (batch,) = read_batches(out)
    check_batch_invariants(batch)
    shared = batch.policy_batches["shared"]
    ends = shared["terminateds"] | shared["truncateds"]
    assert len(np.unique(shared["eps_id"][ends])) == 2 * 5
    assert ends.sum() == 2 * 5 * 2  # both agents of each, to their last row


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sent", "exit_code", "workers"),
    [(signal.SIGINT, 130, 0), (signal.SIGTERM, 143, 0), (signal.SIGINT, 130, 2),
     (signal.SIGTERM, 143, 2), (signal.SIGHUP, 129, 2)],
)
def test_sigint_or_sigterm_to_the_command_leaves_a_complete_log(tmp_path, sent, exit_code, workers) -> None:
    """A real Ctrl-C (SIGINT), or a scheduler's stop (SIGTERM), or a closed terminal
    (SIGHUP), at a random point of the sampling loop, sent to the command's whole process
    group (env worker processes too, as a terminal and Slurm do): every episode it counts
    is on disk, to its end."""
    log, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    processes = ["--set", "vectorize=subprocess", "--set", f"num_workers={workers}"] if workers else []
    command = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marl_runner.cli",
            "sample",
            str(SIMPLE_SPREAD),
            "--steps",
            "10000000",
            *SMALL,
            *processes,
            "--out",
            str(out),
            "--metrics-out",
            str(log),
            "--metrics-interval",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().count("\n") >= 3):
            assert command.poll() is None and time.monotonic() < deadline, command.stdout.read()
            time.sleep(0.05)
        os.killpg(command.pid, sent)
        output, _ = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()
    assert command.returncode == exit_code, output
    assert "interrupted" in output and "Traceback" not in output
    assert log.read_text().endswith("}\n")
    records = read_metrics_log(log)
    assert len(records) >= 3
    check_records_add_up(records, *batch_steps(out))
    assert re.search(rf"env steps\s*│\s*{records[-1]['env_steps']:,}\b", output)
    episodes = sum(r["episodes"] for r in records)
    assert f"({episodes} episodes, {records[-1]['env_steps']} env steps)" in output
    last_rows = sum(
        int(np.sum(b.policy_batches["shared"]["terminateds"] | b.policy_batches["shared"]["truncateds"]))
        for b in read_batches(out)
    )
    assert last_rows == 3 * episodes
    assert re.search(r"faulty episodes\s*│\s*0\b", output)  # no worker was stopped under it


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (lambda tmp: tmp, "is a directory; expected a file path"),
        (lambda tmp: tmp / "a-file" / "metrics.jsonl", "cannot write there: "),
    ],
)
def test_an_unusable_path_is_a_one_line_error_before_sampling(
    tmp_path, capsys, monkeypatch, make_path, message
) -> None:
    (tmp_path / "a-file").write_text("")
    path = make_path(tmp_path)

    def no_sampling(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("sampling started")

    monkeypatch.setattr(cli_sample, "_sample_until", no_sampling)
    code = main(["sample", str(TICTACTOE), "--metrics-out", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"marl-runner sample: error: --metrics-out {path}: {message}")


def test_an_unusable_path_is_a_one_line_error_for_serve(tmp_path, capsys) -> None:
    code = main(["serve", str(DRONES), "--port", "0", "--metrics-out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"--metrics-out {tmp_path}: is a directory" in err


@pytest.mark.parametrize("command", ["sample", "serve"])
@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--format", "parquet"], "--format parquet needs --out DIR"),
        (["--metrics-interval", "0"], "--metrics-interval 0.0 needs --metrics-out FILE"),
    ],
)
def test_an_output_option_without_its_output_is_a_one_line_error(
    capsys, command, given, message
) -> None:
    """Not silently ignored: a user who gave --format or --metrics-interval expects files."""
    config = TICTACTOE if command == "sample" else DRONES
    extra = ["--port", "0"] if command == "serve" else []
    code = main([command, str(config), *extra, *given])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err == f"marl-runner {command}: error: {message}: without it nothing is written"


def play(client: PolicyClient, steps: int, seed: int) -> float:
    """One episode of `steps` steps with random rewards; returns its total reward."""
    rng = np.random.default_rng(seed)
    drones = [f"drone_{i}" for i in range(4)]
    eid = client.start_episode()
    total = 0.0
    for _ in range(steps):
        client.get_action(eid, {d: rng.uniform(-1, 1, 8).astype(np.float32) for d in drones})
        rewards = {d: float(rng.integers(-3, 4)) for d in drones}
        client.log_returns(eid, rewards)
        total += sum(rewards.values())
    client.end_episode(eid, {d: np.zeros(8, np.float32) for d in drones})
    return total


def test_serve_logs_what_its_clients_played(tmp_path) -> None:
    log, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marl_runner.cli",
            "serve",
            str(DRONES),
            "--port",
            "0",
            "--episodes",
            "3",
            "--out",
            str(out),
            "--set",
            "batch_mode=complete_episodes",
            "--set",
            "num_envs=4",
            "--metrics-out",
            str(log),
            "--metrics-interval",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        address = None
        for line in server.stdout:
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if found:
                address = found.group(1)
                break
        assert address
        totals: list[float] = []
        with PolicyClient(address) as client:
            threads = [
                threading.Thread(target=lambda s=s: totals.append(play(client, 5, s)))
                for s in range(3)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        output, _ = server.communicate(timeout=30)  # it stops after the third episode
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, output
    records = read_metrics_log(log)
    check_records_add_up(records, *batch_steps(out))
    assert records[-1]["env_steps"] == 15
    assert sum(r["episodes"] for r in records) == 3
    logged = sum(r["episode_reward_mean"] * r["episodes"] for r in records if r["episodes"])
    assert math.isclose(logged, sum(totals), abs_tol=1e-6)


@pytest.mark.slow
@pytest.mark.ray
def test_runners_in_ray_log_every_batch_of_every_runner(ray_local, tmp_path) -> None:
    log, out = tmp_path / "metrics.jsonl", tmp_path / "out"
    code = main(
        [
            "sample",
            str(SIMPLE_SPREAD),
            "--steps",
            "1600",
            *SMALL,
            "--runners",
            "2",
            "--out",
            str(out),
            "--metrics-out",
            str(log),
            "--metrics-interval",
            "0",
        ]
    )
    assert code == 0
    records = read_metrics_log(log)
    env_steps, agent_steps = batch_steps(out)
    # The last file holds the samples still running when the target was reached (flushed).
    assert env_steps >= 1600 and len(records) == len(list(read_batches(out)))
    check_records_add_up(records, env_steps, agent_steps)
    assert all(r["num_healthy_runners"] == 2 for r in records)
    assert all(r["episodes"] == 8 for r in records[:-1])  # 2 sub-envs x 4 episodes of 25 steps
    assert sum(r["episodes"] for r in records) == env_steps // 25


def test_runners_past_the_limit_are_a_one_line_error_before_ray(capsys) -> None:
    """(Found in review.) --runners has the config's num_runners bound: a 100-digit count
    failed inside Ray's resource arithmetic, naming nothing."""
    code = main(["sample", str(TICTACTOE), "--runners", "9" * 100])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == "marl-runner sample: error: --runners 1e+100: expected at most 10,000"


def test_a_second_run_into_a_directory_another_run_writes_to_is_refused(tmp_path, capsys) -> None:
    """(Found by a probe.) Two runs started together into one --out each found it empty
    and mixed their files: the first run's lock (held as another process would hold it)
    refuses the second at once; once it is let go, the directory is usable."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    with (out / ".marl-runner.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code = main(["sample", str(TICTACTOE), "--steps", "10", "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert err == (
            f"marl-runner sample: error: --out {out}: another run is writing there now; "
            "choose another directory"
        )
        assert not (out / "config.yaml").exists()
    assert main(["sample", str(TICTACTOE), "--steps", "10", "--out", str(out)]) == 0
