"""Uploaded experiences carry the runner's identity columns: agent_id (short strings),
env_t and policy_version (integers); anything else in them is refused with a 400."""

from __future__ import annotations

import numpy as np

from marl_runner.serving import codec
from marl_runner.serving.batches import MAX_AGENT_ID_CHARS, batch_from_value, batch_to_value
from tests.test_serving_hostile import post_binary, upload
from tests.test_serving_http import served, wait_for


def test_agent_id_env_t_and_policy_version_are_uploaded_with_their_types():
    columns = {
        "agent_id": ["a0", "a1", "a0", "a1"],
        "env_t": np.array([0, 0, 1, 1]),
        "policy_version": np.array([3, 3, 3, 4], np.int32),
    }
    with served() as handle:
        status, answer = post_binary(handle, "experiences", upload(**columns))
        assert status == 200, answer
        wait_for(lambda: len(handle.batches) == 1)
    stored = handle.batches[0].policy_batches["p"]
    assert stored["agent_id"].tolist() == columns["agent_id"]
    assert stored["agent_id"].dtype.kind == "U"
    assert stored["env_t"].dtype == stored["policy_version"].dtype == np.int64
    assert stored["policy_version"].tolist() == [3, 3, 3, 4]


def test_a_batch_with_agent_ids_goes_through_the_codec_and_back():
    agent_ids = ["archer_0", "knight_1", "archer_0", "x"]
    with served() as handle:
        policies = dict(handle.server.runner.policy_map.items())
        batch = batch_from_value(upload(agent_id=agent_ids), policies)
        sent = codec.decode(codec.encode(batch_to_value(batch)), codec.BINARY)
        again = batch_from_value(sent, policies)
    assert again.policy_batches["p"]["agent_id"].tolist() == agent_ids


def test_bad_identity_columns_are_refused_naming_the_column_and_row():
    too_long = "a" * (MAX_AGENT_ID_CHARS + 1)
    cases = [
        (upload(agent_id=["a0", "a1", 7, "a0"]), "['agent_id'] row 2: expected a string"),
        (upload(agent_id=["a0", too_long, "a0", "a0"]), f"at most {MAX_AGENT_ID_CHARS} characters"),
        (upload(agent_id=["a0", "a0", "\ud800", "a0"]), "row 2: '\\ud800' is not valid Unicode"),
        (upload(agent_id=np.arange(4)), "['agent_id']: expected a list of strings"),
        (upload(env_t=np.zeros(4)), "['env_t']: expected one integer per row"),
        (upload(policy_version=["1", "2", "3", "4"]), "['policy_version']: expected numbers"),
    ]
    with served() as handle:
        for value, message in cases:
            status, answer = post_binary(handle, "experiences", value)
            assert status == 400 and message in answer["error"], (message, answer)
        assert handle.server.uploads.empty()
