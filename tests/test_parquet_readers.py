"""Parquet batches read by pandas, polars, DuckDB, pyarrow.dataset and Ray Data, without this project.

Per (episode, agent) the reward sums they compute equal those of the .npz
form of the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")

from helpers_batches import CONNECT_FOUR_DICT_OBS, KAZ, sample  # noqa: E402

from marl_runner.io import read_batches, write_batch  # noqa: E402

# Runs in a fresh interpreter away from the repository: no marl_runner on the path.
READERS = textwrap.dedent(
    """
    import json, sys
    import duckdb, pandas, polars, pyarrow.dataset

    out, policy = sys.argv[1], sys.argv[2]
    pattern = f"{out}/{policy}/*.parquet"
    sums = {}
    frame = pandas.read_parquet(f"{out}/{policy}")
    sums["pandas"] = frame.groupby(["eps_id", "agent_index"])["rewards"].sum().to_dict()
    sums["polars"] = {
        (e, a): r
        for e, a, r in polars.read_parquet(pattern)
        .group_by("eps_id", "agent_index")
        .agg(polars.col("rewards").sum())
        .iter_rows()
    }
    query = f"SELECT eps_id, agent_index, sum(rewards) FROM '{pattern}' GROUP BY ALL"
    sums["duckdb"] = {(e, a): r for e, a, r in duckdb.sql(query).fetchall()}
    table = pyarrow.dataset.dataset(f"{out}/{policy}", format="parquet").to_table()
    grouped = table.group_by(["eps_id", "agent_index"]).aggregate([("rewards", "sum")])
    sums["pyarrow.dataset"] = {
        (e, a): r
        for e, a, r in zip(*(grouped.column(c).to_pylist() for c in ("eps_id", "agent_index", "rewards_sum")))
    }
    first_obs = {
        "pandas": frame["obs"].iloc[0],
        "duckdb": duckdb.sql(f"SELECT obs FROM '{pattern}' LIMIT 1").fetchall()[0][0],
    }
    print(json.dumps({
        "project_imported": any(m.startswith("marl_runner") for m in sys.modules),
        "sums": {k: sorted([e, a, float(r)] for (e, a), r in v.items()) for k, v in sums.items()},
        "obs_types": {k: type(v).__name__ for k, v in first_obs.items()},
    }))
    """
)


def npz_reward_sums(out: Path, policy: str) -> list[list]:
    sums: dict[tuple[int, int], float] = defaultdict(float)
    for batch in read_batches(out):
        rows = batch.policy_batches[policy]
        for eps, agent, reward in zip(rows["eps_id"], rows["agent_index"], rows["rewards"]):
            sums[int(eps), int(agent)] += float(reward)
    return sorted([e, a, r] for (e, a), r in sums.items())


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each config sampled once (3 batches), written in both formats."""
    dirs = {}
    for name, config in (("kaz", KAZ), ("connect_four", CONNECT_FOUR_DICT_OBS)):
        out = tmp_path_factory.mktemp(name)
        batches, metadata = sample(config, batches=3)
        for index, batch in enumerate(batches, start=1):
            write_batch(batch, out / "npz", index)
            write_batch(batch, out / "parquet", index, "parquet", metadata=metadata)
        dirs[name] = out
    return dirs


@pytest.mark.parametrize(("run", "policy"), [("kaz", "archer"), ("connect_four", "player_1")])
def test_readers_without_the_project_agree_with_npz(
    run_dirs: dict[str, Path], run: str, policy: str, tmp_path: Path
) -> None:
    out = run_dirs[run]
    result = subprocess.run(
        [sys.executable, "-I", "-c", READERS, str(out / "parquet"), policy],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["project_imported"] is False
    expected = npz_reward_sums(out / "npz", policy)
    assert len(expected) > 1
    for reader, sums in found["sums"].items():
        assert [row[:2] for row in sums] == [row[:2] for row in expected], reader
        assert [row[2] for row in sums] == pytest.approx([row[2] for row in expected]), reader
    if run == "connect_four":  # the Dict obs is a struct: a dict per row
        assert found["obs_types"] == {"pandas": "dict", "duckdb": "dict"}


@pytest.mark.slow
@pytest.mark.ray
def test_ray_data_reads_a_policy(ray_local: object, run_dirs: dict[str, Path]) -> None:
    import ray.data

    out = run_dirs["kaz"]
    dataset = ray.data.read_parquet(str(out / "parquet" / "archer"))
    rows = dataset.select_columns(["eps_id", "agent_index", "rewards"]).take_all()
    sums: dict[tuple[int, int], float] = defaultdict(float)
    for row in rows:
        sums[row["eps_id"], row["agent_index"]] += row["rewards"]
    expected = npz_reward_sums(out / "npz", "archer")
    assert sorted([e, a] for e, a in sums) == [row[:2] for row in expected]
    assert [sums[e, a] for e, a, _ in expected] == pytest.approx([r for _, _, r in expected])
