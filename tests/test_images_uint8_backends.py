"""Pistonball frames stay uint8 from the env to the batch on every process backend.

With the default agent connector chain, native 457x120x3 uint8 frames arrive
in the batch as they left the env, through subprocess workers' shared memory
and through Ray actors, frame for frame what sync sampling gives.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from helpers_runner_connectors import one_torch_thread  # noqa: F401 (a fixture)

from marl_runner import check_batch_invariants
from tests.test_images_end_to_end import RANDOM_POLICY, pistonball_config, sample_sorted

FRAME = gym.spaces.Box(0, 255, (457, 120, 3), np.uint8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _native_frames(**overrides) -> dict[str, np.ndarray]:
    config = pistonball_config({"policy_class": RANDOM_POLICY}, **overrides)
    return sample_sorted(config, fragments=2)


def _check_uint8_frames(rows: dict[str, np.ndarray]) -> None:
    for column in ("obs", "new_obs"):
        assert rows[column].dtype == np.uint8, column
        assert rows[column].shape[1:] == FRAME.shape, column
    assert rows["obs"].any()


def test_subprocess_hands_native_frames_over_as_uint8() -> None:
    sync = _native_frames()
    workers = _native_frames(vectorize="subprocess", num_workers=2)
    _check_uint8_frames(workers)
    for column in ("eps_id", "t", "actions", "obs", "new_obs"):
        np.testing.assert_array_equal(workers[column], sync[column], err_msg=column)


def _episode_starts(rows: dict[str, np.ndarray]) -> list[bytes]:
    """Each episode's first frames, in no particular order (seeded resets: the same as sync's)."""
    return sorted(frame.tobytes() for frame in rows["obs"][rows["t"] == 0])


def test_ray_actors_hand_native_frames_over_as_uint8(ray_local) -> None:
    """Polls wait for both sub-envs (as in test_ray_vector_env), so episodes start where
    sync's do; random actions may still differ (resets come back apart from steps), but
    the seeded first frames of every episode may not."""
    sync = _native_frames()
    remote = _native_frames(vectorize="ray", remote_env_batch_wait_ms=5000)
    _check_uint8_frames(remote)
    assert len(_episode_starts(remote)) >= 4 * 3  # both sub-envs reset within the fragments
    assert _episode_starts(remote) == _episode_starts(sync)
    continued = remote["t"][1:] == remote["t"][:-1] + 1  # the same agent's next step
    np.testing.assert_array_equal(remote["obs"][1:][continued], remote["new_obs"][:-1][continued])


def test_ray_batch_is_uint8_and_keeps_the_batch_invariants(ray_local) -> None:
    from marl_runner import EnvRunner

    with EnvRunner(pistonball_config({"policy_class": RANDOM_POLICY}, vectorize="ray")) as runner:
        assert runner.get_spaces()["p"][0] == FRAME
        batch = runner.sample()
    check_batch_invariants(batch)
    rows = batch.policy_batches["p"]
    per_row = (rows["obs"].nbytes + rows["new_obs"].nbytes) // len(rows)
    assert per_row == 2 * 457 * 120 * 3  # one byte per pixel, not four
