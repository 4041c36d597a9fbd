"""`--format parquet` on `marl-runner sample` and `serve`: episode tables any reader opens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from marl_runner import MultiAgentBatch, SampleBatch
from marl_runner.cli import main
from marl_runner.cli.common import BatchFileWriter
from marl_runner.client import PolicyClient
from marl_runner.io import read_batches
from tests.helpers_serve_process import serve_process

CONNECT_FOUR = Path(__file__).resolve().parents[1] / "examples" / "configs" / "connect_four.yaml"


def test_sample_writes_parquet_that_pandas_and_read_batches_agree_on(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sample", str(CONNECT_FOUR), "--steps", "200", "--out", str(out),
                 "--format", "parquet", "--set", "num_envs=2"])
    assert code == 0, capsys.readouterr().err
    batches = list(read_batches(out))
    assert batches and all(isinstance(b, MultiAgentBatch) for b in batches)
    for policy_id in ("player_0", "player_1"):
        table = pd.read_parquet(out / policy_id)
        rows = sum(len(b.policy_batches[policy_id]) for b in batches)
        assert len(table) == rows
        assert set(table["policy_id"]) == {policy_id}
        read_back = np.concatenate([b.policy_batches[policy_id]["rewards"] for b in batches])
        assert np.array_equal(table["rewards"].to_numpy(), read_back)


def test_writer_reads_metadata_again_when_a_new_policy_appears(tmp_path, monkeypatch):
    class Source:
        """Stands in for a runner whose second policy is built after the first batch."""

        def __init__(self) -> None:
            self.built = ["a"]

    source = Source()
    reads: list[list[str]] = []

    def fake_metadata(runner: Source) -> dict:
        reads.append(list(runner.built))
        return {"env": {"name": "x"}, "spaces": {pid: {} for pid in runner.built}}

    monkeypatch.setattr("marl_runner.io.parquet.parquet_metadata", fake_metadata)
    writer = BatchFileWriter(tmp_path, "parquet", source)

    def batch(*pids: str) -> MultiAgentBatch:
        columns = {"obs": np.zeros((2, 3), np.float32), "rewards": np.ones(2, np.float32),
                   "eps_id": np.array([7, 7]), "t": np.array([0, 1])}
        return MultiAgentBatch({pid: SampleBatch(dict(columns)) for pid in pids}, env_steps=2)

    writer.write(batch("a"), 1)
    writer.write(batch("a"), 2)
    source.built.append("b")
    writer.write(batch("a", "b"), 3)
    assert reads == [["a"], ["a", "b"]]


@pytest.mark.slow
def test_serve_writes_parquet(tmp_path):
    out = tmp_path / "out"
    drones = [f"drone_{i}" for i in range(4)]
    with serve_process("--port", "0", "--out", str(out), "--format", "parquet",
                       "--episodes", "2") as server:
        with PolicyClient(server.address) as client:
            for _ in range(2):
                eid = client.start_episode()
                obs = {d: np.zeros(8, np.float32) for d in drones}
                for _ in range(5):
                    client.get_action(eid, obs)
                    client.log_returns(eid, {d: 1.0 for d in drones})
                client.end_episode(eid, obs)
        server.finish(None)
    table = pd.concat(pd.read_parquet(path) for path in out.iterdir() if path.is_dir())
    assert len(table) == 2 * 5 * len(drones)
    assert table.groupby(["eps_id", "agent_t"]).size().eq(len(drones)).all()
    assert len(list(read_batches(out))) == 2
