"""Each built-in action connector on its own."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import tree
from helpers_connectors import double_action

from connectors import (
    ActionRows,
    ClipActionsConnector,
    ConnectorContext,
    ConvertToNumpyConnector,
    ImmutableActionsConnector,
    LambdaActionConnector,
    NormalizeActionsConnector,
    get_connector,
    register_lambda_action_connector,
)

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
BOX = gym.spaces.Box(np.float32([0, -2]), np.float32([10, 2]), dtype=np.float32)


def output(actions) -> ActionRows:
    n = len(tree.flatten(actions)[0])
    return ActionRows(
        actions=actions,
        state_outs=[np.zeros((n, 2))],
        extra={"vf_preds": np.zeros(n)},
        keys=np.arange(n),
        env_ids=np.zeros(n, np.int64),
        agent_ids=[f"a{i}" for i in range(n)],
    )


def test_convert_to_numpy():
    conn = ConvertToNumpyConnector(ConnectorContext(OBS, BOX))
    out = output({"a": torch.tensor([1, 2]), "b": np.array([3, 4])})
    converted = conn(out)
    assert isinstance(converted.actions["a"], np.ndarray)
    np.testing.assert_array_equal(converted.actions["a"], [1, 2])
    assert converted.actions["b"] is out.actions["b"]
    assert isinstance(out.actions["a"], torch.Tensor)  # input untouched
    plain = output(np.array([1, 2]))
    assert conn(plain) is plain


def test_normalize_actions_unsquashes_box():
    conn = NormalizeActionsConnector(ConnectorContext(OBS, BOX))
    out = conn(output(np.array([[-1.0, 0.0], [1.0, 1.0], [0.0, 5.0]], np.float32)))
    np.testing.assert_allclose(out.actions, [[0, 0], [10, 2], [5, 2]])
    assert out.actions.dtype == np.float32


def test_normalize_actions_passes_infinite_dims_and_discrete():
    half_open = gym.spaces.Box(np.float32([0, -np.inf]), np.float32([4, np.inf]), dtype=np.float32)
    conn = NormalizeActionsConnector(ConnectorContext(OBS, half_open))
    out = conn(output(np.array([[0.0, 7.0]], np.float32)))
    np.testing.assert_allclose(out.actions, [[2.0, 7.0]])
    discrete = NormalizeActionsConnector(ConnectorContext(OBS, gym.spaces.Discrete(3)))
    same = output(np.array([0, 2]))
    assert discrete(same) is same


def test_clip_actions_nested_space():
    space = gym.spaces.Dict({"move": BOX, "pick": gym.spaces.Discrete(3)})
    conn = ClipActionsConnector(ConnectorContext(OBS, space))
    out = conn(output({"move": np.array([[20.0, -5.0], [5.0, 1.0]]), "pick": np.array([2, 7])}))
    np.testing.assert_array_equal(out.actions["move"], [[10, -2], [5, 1]])
    np.testing.assert_array_equal(out.actions["pick"], [2, 7])  # not a Box: passes
    tuple_space = gym.spaces.Tuple((gym.spaces.Discrete(2), BOX))
    conn = ClipActionsConnector(ConnectorContext(OBS, tuple_space))
    out = conn(output((np.array([1]), np.array([[-3.0, 3.0]]))))
    np.testing.assert_array_equal(out.actions[1], [[0, 2]])


def test_immutable_actions():
    conn = ImmutableActionsConnector(ConnectorContext(OBS, BOX))
    raw = np.zeros((2, 2))
    out = conn(output({"x": raw}))
    with pytest.raises(ValueError, match="read-only"):
        out.actions["x"][0, 0] = 1.0
    raw[0, 0] = 1.0  # the caller's raw array stays writable


def test_lambda_action_connector_and_registration():
    ctx = ConnectorContext(OBS, gym.spaces.Discrete(5))
    conn = LambdaActionConnector(ctx, double_action)
    out = conn(output(np.array([1, 2])))
    np.testing.assert_array_equal(out.actions, [2, 4])
    np.testing.assert_array_equal(out.keys, [0, 1])
    assert conn.to_state() == ("LambdaActionConnector", {"fn": "helpers_connectors:double_action"})

    cls = register_lambda_action_connector("DoubleActionTest", double_action)
    assert cls(ctx).to_state() == ("DoubleActionTest", {})
    rebuilt = get_connector("DoubleActionTest", ctx, {})
    np.testing.assert_array_equal(rebuilt(output(np.array([3]))).actions, [6])
