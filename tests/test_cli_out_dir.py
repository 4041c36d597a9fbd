"""`marl-runner sample --out`: an unusable directory is a one-line error (exit 2) before sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import marl_runner.cli.sample as cli_sample
from marl_runner.cli import main
from marl_runner.io import list_batch_files
from tests.runner_helpers import config


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    cfg = config("tests.envs:CrashingEnv", num_envs=1, rollout_fragment_length=4)
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


def run_sample(config_path: Path, out: Path, capsys, monkeypatch) -> tuple[int, str]:
    def no_sampling(*args, **kwargs):
        raise AssertionError("sampling started")

    monkeypatch.setattr(cli_sample, "_sample_until", no_sampling)
    code = main(["sample", str(config_path), "--out", str(out)])
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_missing_parents_are_made(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    cfg = config("marl_runner.bench.envs:CheapEnv", num_envs=1, rollout_fragment_length=4)
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    out = tmp_path / "runs" / "first" / "out"
    code = main(["sample", str(path), "--out", str(out), "--steps", "8"])
    assert code == 0, capsys.readouterr().err
    assert (out / "config.yaml").is_file() and list_batch_files(out)


def test_out_under_a_file_is_a_one_line_error(config_path, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, err = run_sample(config_path, blocker / "sub", capsys, monkeypatch)
    assert code == 2
    assert f"--out {blocker / 'sub'}: {blocker} is not a directory" in one_line(err)


def test_unwritable_out_is_a_one_line_error(config_path, tmp_path, capsys, monkeypatch):
    """Tests run as root, whom chmod does not stop: make the config file a directory."""
    out = tmp_path / "out"
    (out / "config.yaml").mkdir(parents=True)
    code, err = run_sample(config_path, out, capsys, monkeypatch)
    assert code == 2
    assert f"--out {out}: cannot write there: Is a directory" in one_line(err)


def test_read_only_out_is_a_one_line_error(config_path, tmp_path, capsys, monkeypatch):
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o500)
    try:
        probe = out / "probe"
        try:
            probe.write_text("")
        except PermissionError:
            pass
        else:
            probe.unlink()
            pytest.skip("this user (root) can write to a read-only directory")
        code, err = run_sample(config_path, out, capsys, monkeypatch)
        assert code == 2
        assert "cannot write there: Permission denied" in one_line(err)
    finally:
        out.chmod(0o700)
