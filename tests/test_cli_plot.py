"""`marl-runner plot`: learning curves from a sampled metrics log or a progress.csv,
and one-line errors (exit 2) for what cannot be drawn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from marl_runner import metrics_log
from marl_runner.cli import main
from marl_runner.metrics_log import MAX_LINE_CHARS, MAX_LOG_BYTES, read_metrics_log

REPO = Path(__file__).resolve().parents[1]
TICTACTOE = REPO / "examples" / "configs" / "tictactoe.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's metrics log: tic-tac-toe, two seats, a record per batch."""
    run = tmp_path_factory.mktemp("run")
    argv = [
        "sample",
        str(TICTACTOE),
        "--steps",
        "400",
        "--set",
        "num_envs=2",
        "--metrics-out",
        str(run / "metrics.jsonl"),
        "--metrics-interval",
        "0",
    ]
    assert main(argv) == 0
    assert len(read_metrics_log(run / "metrics.jsonl")) == 4
    return run


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def plot_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["plot", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("marl-runner plot: error: ")
    return err


def test_a_run_directory_is_drawn_next_to_its_log(run_dir, capsys) -> None:
    assert main(["plot", str(run_dir)]) == 0
    assert_png(run_dir / "metrics.png")
    assert "episode_reward_mean over env_steps, 4 rows" in capsys.readouterr().out


def test_a_nested_key_draws_every_policy(run_dir, tmp_path, capsys) -> None:
    out = tmp_path / "img" / "seats.png"
    argv = [
        str(run_dir / "metrics.jsonl"),
        "--out",
        str(out),
        "--x",
        "elapsed_s",
        "--y",
        "policy_reward_mean",
        "episode_len_mean",
    ]
    assert main(["plot", *argv]) == 0
    assert_png(out)
    stdout = capsys.readouterr().out
    drawn = "policy_reward_mean/player_1, policy_reward_mean/player_2, episode_len_mean"
    assert f"{drawn} over elapsed_s" in stdout


def test_a_training_runs_progress_csv(tmp_path, capsys) -> None:
    (tmp_path / "progress.csv").write_text(
        "iteration,env_steps,sps,episode_reward_mean\n1,800,900.5,\n2,1600,950.0,-70.5\n"
        "3,2400,940.0,-66.0\n"
    )
    assert main(["plot", str(tmp_path), "--y", "episode_reward_mean", "sps"]) == 0
    assert_png(tmp_path / "progress.png")
    assert "3 rows of" in capsys.readouterr().out


def test_unknown_columns_name_the_available_ones(run_dir, capsys) -> None:
    err = plot_error([str(run_dir), "--y", "reward"], capsys)
    assert "--y reward: no such column in" in err
    assert "available: " in err and "episode_reward_mean" in err
    assert "policy_reward_mean/player_1" in err and "faults" not in err
    err = plot_error([str(run_dir), "--x", "steps"], capsys)
    assert "--x steps: no such column" in err and "agent_steps" in err


def test_missing_and_empty_inputs(tmp_path, capsys) -> None:
    missing = tmp_path / "nothing-here"
    assert f"{missing}: no such file or directory" in plot_error([str(missing)], capsys)
    assert "holds neither metrics.jsonl nor progress.csv" in plot_error([str(tmp_path)], capsys)
    (tmp_path / "metrics.jsonl").write_text("")
    assert "metrics.jsonl: holds no records yet" in plot_error([str(tmp_path)], capsys)
    assert not (tmp_path / "metrics.png").exists()


def test_a_log_without_finished_episodes_says_so(tmp_path, capsys) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"env_steps": 10, "episodes": 0, "episode_reward_mean": null}\n'
        '{"env_steps": 20, "episodes": 0, "episode_reward_mean": null}\n'
    )
    assert "no row has finite values" in plot_error([str(log)], capsys)


def test_a_broken_record_names_its_line(tmp_path, capsys) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"env_steps": 10}\n{"env_steps": \n{"env_steps": 30}\n')
    assert f"{log}:2: not a JSON record" in plot_error([str(log)], capsys)


def test_a_sampling_log_is_drawn_with_a_no_training_note(run_dir, tmp_path, capsys) -> None:
    """Issue 21: a `sample` log's reward curve is a fixed policy's spread, not learning."""
    out = tmp_path / "curve.png"
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    note = next(line for line in stdout.splitlines() if line.startswith("note:"))
    assert "records no training" in note and "policy_loss" in note and "not learning" in note
    assert_png(out)


def test_a_training_run_gets_no_note(tmp_path, capsys) -> None:
    (tmp_path / "progress.csv").write_text(
        "iteration,env_steps,episode_reward_mean,archer/policy_loss\n1,800,-70.5,0.3\n"
        "2,1600,-66.0,0.2\n"
    )
    assert main(["plot", str(tmp_path)]) == 0
    assert "note:" not in capsys.readouterr().out


def test_has_training() -> None:
    from marl_runner.cli.plot import has_training

    assert has_training(["env_steps", "lr"]) and has_training(["knight/value_loss"])
    assert not has_training(["env_steps", "episode_reward_mean", "perf/mean_inference_ms"])


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("list.jsonl", '{"env_steps": 1}\n[1, 2, 3]\n{"env_steps": 2}\n', ":2: a record is a JSON object, got a list"),
        ("deep.jsonl", '{"env_steps": 1}\n' + "[" * 100_000 + "]" * 100_000 + "\n{}\n", ":2: not a record to draw: nested too deep"),
        ("nested.jsonl", '{"a": ' * 40 + "1" + "}" * 40 + "\n", ":1: a record nested more than 32 levels deep"),
        ("digits.jsonl", '{"env_steps": ' + "9" * 5000 + "}\n{}\n", ":1: not a record to draw: Exceeds the limit (4300 digits)"),
        ("extra.csv", "env_steps,episode_reward_mean\n1,2,3,4\n", ":2: a row of 4 cells under a header of 2"),
        ("text.csv", "env_steps,episode_reward_mean\n1,2\n2,abc\n", ":3: a cell is not a number: 'abc'"),
        ("long.csv", "env_steps\n" + "1" * 200_000 + "\n", ":2: not CSV: field larger than field limit"),
    ],
)  # fmt: skip
def test_a_crafted_log_is_a_one_line_error_naming_its_line(tmp_path, capsys, name, text, words):
    """A list record (AttributeError), deep JSON (RecursionError), extra CSV cells
    (TypeError) and a 5,000-digit int (ValueError) each ended plot with a traceback."""
    log = tmp_path / name
    log.write_text(text)
    assert f"{log}{words}" in plot_error([str(log)], capsys)


def test_a_number_too_large_for_a_float_is_left_out_like_infinity(tmp_path, capsys) -> None:
    """An int of 400 digits as x was an OverflowError; it is an infinite value, left out."""
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"env_steps": 10, "episode_reward_mean": 1.0}\n'
        f'{{"env_steps": {"1" + "0" * 400}, "episode_reward_mean": 2.0}}\n'
        '{"env_steps": 30, "episode_reward_mean": 3.0}\n'
    )
    out = tmp_path / "curve.png"
    assert main(["plot", str(log), "--out", str(out)]) == 0
    assert_png(out)


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path, capsys) -> None:
    """A FIFO hung plot; a symlink to /dev/zero read 2.7 GB before a MemoryError."""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert f"{fifo}: is not a regular file (a FIFO)" in plot_error([str(fifo)], capsys)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    assert "not a regular file (a character device)" in plot_error([str(zero)], capsys)
    big = tmp_path / "progress.csv"
    with big.open("wb") as file:
        file.truncate(MAX_LOG_BYTES + 1)  # sparse: no disk used
    err = plot_error([str(tmp_path / "progress.csv")], capsys)
    assert f"more than the {MAX_LOG_BYTES:,} accepted" in err


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("line.jsonl", '{"a": "' + "x" * MAX_LINE_CHARS + '"}\n', ":1: a line longer than the 1,048,576"),
        ("blank.jsonl", "\n" * 100 + "{}\n", ":101: the log holds more than the 100 values"),
        ("keys.jsonl", "{}\n" + json.dumps(dict.fromkeys(map(str, range(40)), [0, 1])), ":2: the log holds more"),
        ("tiny.csv", "env_steps\n" + "1\n" * 60, ":52: the log holds more than the 100 values"),
    ],
)  # fmt: skip
def test_the_lines_and_values_held_are_bounded(
    tmp_path, capsys, monkeypatch, name, text, words
) -> None:
    """Files under the size bound can still hold millions of tiny records (4 GB for 32 MiB of
    one-cell CSV rows); each is refused at the line past a bound, before more is held
    (MAX_LOG_VALUES is lowered to 100 here to keep the files small)."""
    monkeypatch.setattr(metrics_log, "MAX_LOG_VALUES", 100)
    log = tmp_path / name
    log.write_text(text)
    assert f"{log}{words}" in plot_error([str(log)], capsys)


def test_odd_but_valid_inputs_name_what_was_written_or_what_is_wrong(tmp_path, capsys) -> None:
    """Found by a probe: a CSV with a byte-order mark, `--out` without a suffix or naming a
    directory, a column that is there but not all numbers, and a title with dollars."""
    bom = tmp_path / "progress.csv"
    bom.write_bytes("\ufeffenv_steps,episode_reward_mean\n10,1.0\n20,2.0\n".encode())
    assert main(["plot", str(bom), "--out", str(tmp_path / "noext"), "--title", "cost $5 vs $1"]) == 0
    assert f"wrote {tmp_path / 'noext.png'} " in capsys.readouterr().out
    assert_png(tmp_path / "noext.png")
    assert f"--out {tmp_path}: is a directory" in plot_error([str(bom), "--out", str(tmp_path)], capsys)
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"env_steps": 10, "done": true}\n{"env_steps": 20, "done": false}\n')
    error = plot_error([str(log), "--y", "done"], capsys)
    assert "--y done: column of" in error and "holds values that are not numbers" in error
