"""Info values JSON cannot hold: stored as markers, the batch kept, one warning naming the row."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marl_runner.batch import MultiAgentBatch, SampleBatch
from marl_runner.bench.envs.cheap_env import CheapEnv
from marl_runner.cli import main
from marl_runner.io import json_rows, read_batches, write_batch
from marl_runner.io.json_rows import MAX_ROW_DEPTH, NOT_JSON

NO_PYARROW = importlib.util.find_spec("pyarrow") is None
FORMATS = [
    "npz",
    pytest.param("parquet", marks=pytest.mark.skipif(NO_PYARROW, reason="no pyarrow")),
]


class Handle:
    def __repr__(self) -> str:
        return "Handle(7)"


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"d": value}
    return value


def batch_with(info: Any, policy: str) -> MultiAgentBatch:
    """Four rows of sub-envs 0..3, agents a0/a1; sub-env 3's a1 row holds ``info``."""
    infos = np.empty(4, dtype=object)
    infos[:] = [{"x": 1}, {}, {"pos": np.arange(2)}, {"ok": 1.5, "bad": info}]
    batch = SampleBatch(
        obs=np.arange(8, dtype=np.float32).reshape(4, 2),
        actions=np.array([0, 1, 2, 3]),
        env_id=np.arange(4),
        agent_id=np.array(["a0", "a1", "a0", "a1"]),
        infos=infos,
    )
    return MultiAgentBatch({policy: batch}, env_steps=4)


CASES = {
    "set": ({1, 2}, {NOT_JSON: "set", "repr": "{1, 2}"}),
    "bytes": (b"\xff\x00", {NOT_JSON: "bytes", "repr": "b'\\xff\\x00'"}),
    "object": (Handle(), {NOT_JSON: "Handle", "repr": "Handle(7)"}),
    "set in a list": ([1, frozenset()], [1, {NOT_JSON: "frozenset", "repr": "frozenset()"}]),
    "tuple key": ({(1, 2): 3, "k": 4}, {"(1, 2)": 3, "k": 4}),
    "huge int": (10**5000, {NOT_JSON: "int", "repr": hex(10**5000)}),
}


@pytest.mark.parametrize("file_format", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_value_json_cannot_hold_is_a_marker_and_the_batch_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file_format: str, case: str
) -> None:
    info, stored = CASES[case]
    policy = f"p_{file_format}_{list(CASES).index(case)}"  # warned once per column
    batch = batch_with(info, policy)
    with caplog.at_level(logging.WARNING, logger="marl_runner.io.json_rows"):
        write_batch(batch, tmp_path, 1, file_format)
        write_batch(batch, tmp_path, 2, file_format)
    [first, second] = list(read_batches(tmp_path))
    for loaded in (first, second):
        rows = loaded.policy_batches[policy]
        assert list(rows["infos"]) == [{"x": 1}, {}, {"pos": [0, 1]}, {"ok": 1.5, "bad": stored}]
        np.testing.assert_array_equal(rows["obs"], batch.policy_batches[policy]["obs"])
    [record] = caplog.records  # once per column, not once per batch
    message = record.getMessage()
    assert f"'{policy}/infos'" in message and "env_id 3, agent_id 'a1'" in message
    assert "['bad']" in message and "exclude_columns: [infos]" in message


@pytest.mark.parametrize("file_format", FORMATS)
def test_deep_info_is_cut_at_the_depth_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file_format: str
) -> None:
    """5000 levels made json.dumps raise a bare RecursionError; 100 levels would write a
    row deeper than the reader's bound."""
    for index, levels in enumerate((5000, MAX_ROW_DEPTH + 5), start=1):
        with caplog.at_level(logging.WARNING, logger="marl_runner.io.json_rows"):
            write_batch(
                batch_with(deep(levels), f"deep{levels}_{file_format}"),
                tmp_path,
                index,
                file_format,
            )
        assert f"nested deeper than {MAX_ROW_DEPTH} levels" in caplog.records[-1].getMessage()
    for loaded in read_batches(tmp_path):
        [rows] = loaded.policy_batches.values()
        node, depth = rows["infos"][3]["bad"], 2
        while NOT_JSON not in node:
            node, depth = next(iter(node.values())), depth + 1
        assert depth == MAX_ROW_DEPTH + 1 and node[NOT_JSON] == "dict"
        assert node["repr"].startswith("{'d': {'d':")
        assert list(rows["infos"][:3]) == [{"x": 1}, {}, {"pos": [0, 1]}]


def test_info_at_the_depth_bound_is_kept_as_it_is(tmp_path: Path) -> None:
    write_batch(batch_with(deep(MAX_ROW_DEPTH - 2), "p"), tmp_path, 1)
    [loaded] = read_batches(tmp_path)
    assert loaded.policy_batches["p"]["infos"][3]["bad"] == deep(MAX_ROW_DEPTH - 2)


class SetInOneInfo(CheapEnv):
    """CheapEnv whose second-built sub-env puts a set in agent_1's info at its 15th step."""

    built = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index, SetInOneInfo.built = SetInOneInfo.built, SetInOneInfo.built + 1
        self.steps = 0

    def step(self, actions: dict) -> Any:
        self.steps += 1
        obs, rewards, terminateds, truncateds, infos = super().step(actions)
        if self.index == 1 and self.steps == 15:
            infos = {**infos, "agent_1": {"seen": {3, 4}}}
        return obs, rewards, terminateds, truncateds, infos


@pytest.mark.parametrize("file_format", FORMATS)
def test_sample_keeps_every_batch_when_one_sub_env_puts_a_set_in_an_info(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    file_format: str,
) -> None:
    """The set ended `marl-runner sample --out` (exit 1) and lost its batch and every later one."""
    # The class the config names: pytest may have imported this file under another name.
    monkeypatch.setattr(importlib.import_module("tests.test_io_json_rows").SetInOneInfo, "built", 0)
    monkeypatch.setattr(json_rows, "_warned", set())
    config, out = tmp_path / "set.yaml", tmp_path / "out"
    config.write_text(
        "env: {name: 'tests.test_io_json_rows:SetInOneInfo', api: multi_agent,"
        " config: {num_agents: 2, episode_len: 10}}\n"
        "num_envs: 2\nrollout_fragment_length: 10\n"
        "policies: {shared: {model: {type: mlp, hidden: [8]}}}\n"
    )
    args = ["sample", str(config), "--steps", "60", "--out", str(out), "--format", file_format]
    with caplog.at_level(logging.WARNING, logger="marl_runner.io.json_rows"):
        assert main(args) == 0
    batches = list(read_batches(out))
    assert sum(batch.env_steps() for batch in batches) == 60
    marked = [
        (int(rows["env_id"][i]), str(rows["agent_id"][i]))
        for rows in (batch.policy_batches["shared"] for batch in batches)
        for i, info in enumerate(rows["infos"])
        if info == {"seen": {NOT_JSON: "set", "repr": "{3, 4}"}}
    ]
    rows = [info for batch in batches for info in batch.policy_batches["shared"]["infos"]]
    assert len(marked) == 1 and rows.count({}) == len(rows) - 1
    [record] = caplog.records
    env_id, agent_id = marked[0]
    assert "'shared/infos', row" in record.getMessage()
    assert f"(env_id {env_id}, agent_id '{agent_id}')" in record.getMessage()
    assert agent_id == "agent_1" and "['seen']" in record.getMessage()


def test_a_row_with_nothing_replaced_takes_no_warning_from_a_later_one(caplog) -> None:
    """(Found in review.) A numpy key (JSON's encoder refuses it; it is written as its
    number) replaces nothing, so it must not use up the column's one warning: the set
    in a later row of the same column is still reported."""
    json_rows._warned.discard("review/infos")
    with caplog.at_level(logging.WARNING, logger=json_rows.__name__):
        texts = json_rows.rows_to_json([{np.int64(5): "x"}, {"s": {1, 2}}], "review/infos")
    assert texts[0] == '{"5": "x"}'
    assert NOT_JSON in texts[1]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "row 1" in messages[0] and "['s'] (set)" in messages[0]
