"""A local-inference client checks every value at the call, with the server's own checks.

Without that, a value the server refuses (a complex info, a NaN observation)
is taken, the upload of its episode is refused later, local inference stops
and the other episodes of that upload are lost.
"""

from __future__ import annotations

import numpy as np
import pytest

from marl_runner.client import PolicyClient
from marl_runner.io import list_batch_files, read_batches
from tests.test_serving_http import served, wait_for

OBS = {"a0": np.zeros(3, np.float32)}


def test_a_complex_info_raises_at_the_call_and_every_episode_is_still_written(tmp_path):
    with served(out_dir=tmp_path) as handle:
        with PolicyClient(handle.server.address, inference_mode="local") as client:
            first = client.start_episode()
            second = client.start_episode()
            client.get_action(first, OBS)
            client.get_action(second, OBS)
            client.log_returns(first, {"a0": 1.0})
            with pytest.raises(ValueError, match=r"infos of agent 'a0'\['z'\].*complex"):
                client.log_returns(second, {"a0": 5.0}, {"a0": {"z": np.array([1 + 2j])}})
            with pytest.raises(ValueError, match=r"observation of agent 'a0' has a NaN"):
                client.get_action(second, {"a0": np.array([0, np.nan, 0], np.float32)})
            client.log_returns(second, {"a0": 2.0}, {"a0": {"z": 3}})
            client.end_episode(first, OBS)
            wait_for(lambda: client.episodes_uploaded == 1)
            client.end_episode(second, OBS)
        assert client.episodes_uploaded == 2
        wait_for(lambda: len(list_batch_files(tmp_path)) == 2)
    rewards = sorted(b.policy_batches["p"]["rewards"].tolist() for b in read_batches(tmp_path))
    assert rewards == [[1.0], [2.0]]  # the refused call added nothing to its episode
