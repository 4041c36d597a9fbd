"""Damaged and crafted batch files: every failure is a BatchFileError naming the file."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.io import read_batch, write_batch
from marl_runner.io.batch_checks import BatchFileError


def npz_batch(tmp_path: Path) -> Path:
    infos = np.empty(20, dtype=object)
    infos[:] = [{"k": [1, 2]}] * 20
    batch = SampleBatch(
        obs=np.random.default_rng(0).random((20, 3)).astype(np.float32),
        actions=np.zeros(20, np.int64),
        agent_id=np.array(["a0"] * 20),
        infos=infos,
    )
    return write_batch(MultiAgentBatch({"p": batch}, env_steps=20), tmp_path, 1)


def edited(path: Path, original: bytes, signature: bytes, offset: int, value: int) -> None:
    data = bytearray(original)
    data[data.index(signature) + offset] = value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("signature", "offset", "value", "problem"),
    [
        (b"p/obs.npy", 200, 0xFF, r"entry 'p/obs' is damaged: BadZipFile: Bad CRC-32"),
        (b"PK\x01\x02", 6, 139, r"not a zip of \.npy arrays \(zip file version 13\.9\)"),
        (b"PK\x01\x02", 8, 1, r"encrypted, password required"),
    ],
    ids=["data byte", "zip version", "encrypted flag"],
)
def test_damaged_npz_is_a_batch_file_error(
    tmp_path: Path, signature: bytes, offset: int, value: int, problem: str
) -> None:
    """A flipped byte escaped as zipfile.BadZipFile / NotImplementedError / RuntimeError,
    naming no file."""
    path = npz_batch(tmp_path)
    edited(path, path.read_bytes(), signature, offset, value)
    with pytest.raises(BatchFileError, match=rf"^{path} is not a readable .*{problem}"):
        read_batch(path)


def test_random_byte_edits_of_an_npz_raise_only_batch_file_errors(tmp_path: Path) -> None:
    path = npz_batch(tmp_path)
    original = path.read_bytes()
    rng = random.Random(2)
    failures = 0
    for _ in range(150):
        data = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            read_batch(path)
        except BatchFileError as exc:
            assert str(path) in str(exc)
            failures += 1
    assert failures > 100  # most edits are caught, none escapes as another error


def test_a_parquet_column_name_that_is_not_utf8_is_a_batch_file_error(tmp_path: Path) -> None:
    """pyarrow decodes column names late: the bare UnicodeDecodeError named no file."""
    pytest.importorskip("pyarrow")
    rows = SampleBatch(obs=np.zeros((2, 3), np.float32), rewards=np.ones(2, np.float32))
    manifest = write_batch(MultiAgentBatch({"p": rows}, env_steps=2), tmp_path, 1, "parquet")
    data_file = tmp_path / "p" / "batch_000001.parquet"
    data_file.write_bytes(data_file.read_bytes().replace(b"rewards", b"rew\xb0rds"))
    with pytest.raises(BatchFileError, match=rf"{data_file}: .*not UTF-8"):
        read_batch(manifest)
