"""AgentRows / ActionRows: the column containers connectors work on."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_connectors import make_rows

from connectors import (
    ActionConnectorDataType,
    ActionRows,
    AgentConnectorDataType,
    AgentConnectorsOutput,
    AgentRows,
    ConnectorError,
)


def test_column_access():
    rows = AgentRows({"obs": np.zeros((3, 2)), "agent_ids": ["a", "b", "c"]})
    assert len(rows) == 3 and "obs" in rows and "x" not in rows
    rows["x"] = np.arange(3)
    assert set(rows.columns) == {"obs", "agent_ids", "x"}
    assert rows.get("missing", 7) == 7
    del rows["x"]
    assert list(rows) == ["obs", "agent_ids"]
    assert len(AgentRows()) == 0


def test_len_prefers_keys_and_handles_nested_columns():
    rows = AgentRows({"obs": {"a": np.zeros((4, 2)), "b": np.zeros(4)}})
    assert len(rows) == 4
    rows["keys"] = np.arange(4)
    assert len(rows) == 4


@pytest.mark.parametrize(
    "selector",
    [np.array([True, False, True, False]), [0, 2], np.array([0, 2]), slice(0, 4, 2)],
)
def test_select_indexes_every_kind_of_column(selector):
    rows = AgentRows(
        {
            "obs": np.arange(8).reshape(4, 2),
            "agent_ids": ["a", "b", "c", "d"],
            "nested": {"x": np.arange(4), "y": (np.arange(4) * 10,)},
        }
    )
    picked = rows.select(selector)
    assert picked is not rows
    np.testing.assert_array_equal(picked["obs"], [[0, 1], [4, 5]])
    assert picked["agent_ids"] == ["a", "c"]
    np.testing.assert_array_equal(picked["nested"]["x"], [0, 2])
    np.testing.assert_array_equal(picked["nested"]["y"][0], [0, 20])
    assert len(rows) == 4  # the original is untouched


def test_select_nothing():
    rows = make_rows([np.zeros(2)] * 3)
    empty = rows.select(np.zeros(3, np.bool_))
    assert len(empty) == 0 and empty["agent_ids"] == []
    assert len(rows.select([])) == 0


def test_items_round_trip_keeps_column_kinds():
    rows = make_rows([np.ones(2, np.float32), np.zeros(2, np.float32)], env_ids=[3, 4])
    items = rows.to_items()
    assert isinstance(items[0], AgentConnectorDataType)
    assert items[1].env_id == 4 and items[1].agent_id == "agent_1"
    assert "env_ids" not in items[0].data and "agent_ids" not in items[0].data
    back = AgentRows.from_items(items, like=rows)
    assert isinstance(back["obs"], list)  # raw obs stays a list, as it came in
    assert isinstance(back["rewards"], np.ndarray) and back["rewards"].dtype == np.float32
    assert back["infos"] == [{}, {}]
    np.testing.assert_array_equal(back["env_ids"], [3, 4])
    assert back["agent_ids"] == ["agent_0", "agent_1"]
    np.testing.assert_array_equal(back["keys"], rows["keys"])


def test_from_items_infers_new_columns_and_reports_missing_values():
    items = [
        AgentConnectorDataType(0, "a", {"v": 1.5, "s": "x"}),
        AgentConnectorDataType(1, "b", {"v": 2.5, "s": "y"}),
    ]
    rows = AgentRows.from_items(items)
    np.testing.assert_array_equal(rows["v"], [1.5, 2.5])
    assert rows["s"] == ["x", "y"]
    items[1].data.pop("v")
    with pytest.raises(ConnectorError, match="item 1 has no 'v'"):
        AgentRows.from_items(items)


def test_from_items_empty_keeps_columns():
    rows = make_rows([np.zeros(2)] * 2)
    empty = AgentRows.from_items([], like=rows)
    assert len(empty) == 0 and set(empty.columns) == set(rows.columns)


def test_action_rows_items_round_trip():
    input_rows = AgentRows({"obs": np.arange(6).reshape(3, 2)})
    out = ActionRows(
        actions={"move": np.array([0, 1, 2]), "speed": np.ones((3, 2))},
        state_outs=[np.arange(3.0)],
        extra={"vf_preds": np.array([0.5, 0.6, 0.7])},
        keys=np.array([5, 6, 7]),
        env_ids=np.array([0, 0, 1]),
        agent_ids=["a", "b", "a"],
        input_rows=input_rows,
    )
    items = out.to_items()
    assert isinstance(items[2], ActionConnectorDataType)
    assert items[2].env_id == 1 and items[2].agent_id == "a"
    np.testing.assert_array_equal(items[2].input_dict["obs"], [4, 5])
    action, states, extra = items[2].output
    assert action["move"] == 2 and states[0] == 2.0 and extra["vf_preds"] == 0.7
    back = ActionRows.from_items(items, like=out)
    np.testing.assert_array_equal(back.actions["speed"], out.actions["speed"])
    np.testing.assert_array_equal(back.state_outs[0], out.state_outs[0])
    np.testing.assert_array_equal(back.keys, out.keys)
    with pytest.raises(ConnectorError, match="one item per row"):
        ActionRows.from_items(items[:2], like=out)


def test_agent_connectors_output():
    out = AgentConnectorsOutput(raw_dict={"obs": 1}, sample_batch={"obs": 2})
    assert out.raw_dict["obs"] == 1 and out.sample_batch["obs"] == 2
