"""Image observations through the agent connectors: uint8 kept, grayscale, resize, frame stacks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from helpers_connectors import make_rows

from connectors import (
    ConnectorContext,
    ConnectorError,
    GrayscaleAgentConnector,
    ObsPreprocessorConnector,
    ResizeAgentConnector,
    ViewRequirementAgentConnector,
    build_pipeline,
    get_connector,
    is_image_space,
)
from connectors.agent.images import resize_weights
from connectors.errors import MAX_OBS_VALUES
from connectors.registry import check_spec_list

RGB = gym.spaces.Box(0, 255, (6, 4, 3), np.uint8)
ACTIONS = gym.spaces.Discrete(3)


def ctx_for(space: gym.Space, **kwargs) -> ConnectorContext:
    return ConnectorContext(space, ACTIONS, **kwargs)


def bound(connector, space):
    return connector, connector.bind_input_space(space)


def random_frames(n: int, shape: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return list(rng.integers(0, 256, (n, *shape), dtype=np.uint8))


# --------------------------------------------------------------------------- what is an image


def test_image_spaces_are_rank_3_uint8_boxes():
    assert is_image_space(RGB)
    assert is_image_space(gym.spaces.Box(0, 255, (84, 84, 1), np.uint8))
    assert not is_image_space(gym.spaces.Box(0, 255, (84, 84), np.uint8))  # no channel axis
    assert not is_image_space(gym.spaces.Box(0, 1, (3, 3, 2), np.int8))  # tictactoe board
    assert not is_image_space(gym.spaces.Box(0.0, 1.0, (8, 8, 3), np.float32))
    assert not is_image_space(gym.spaces.Discrete(4))


# --------------------------------------------------------------------------- ObsPreprocessorConnector


def test_preprocessor_keeps_images_uint8_and_unflattened():
    conn, out_space = bound(ObsPreprocessorConnector(ctx_for(RGB)), RGB)
    assert out_space == RGB
    frames = random_frames(5, RGB.shape)
    obs = conn(make_rows(frames))["obs"]
    assert obs.dtype == np.uint8 and obs.shape == (5, *RGB.shape)
    np.testing.assert_array_equal(obs, np.stack(frames))
    assert conn(make_rows([]))["obs"].shape == (0, *RGB.shape)
    assert conn(make_rows([]))["obs"].dtype == np.uint8


def test_preprocessor_still_flattens_non_image_boxes_to_float32():
    for space in (
        gym.spaces.Box(0, 1, (3, 3, 2), np.int8),
        gym.spaces.Box(0.0, 255.0, (6, 4, 3), np.float32),
        gym.spaces.Box(0, 255, (6, 4), np.uint8),
    ):
        conn, out_space = bound(ObsPreprocessorConnector(ctx_for(space)), space)
        size = int(np.prod(space.shape))
        assert out_space.shape == (size,) and out_space.dtype == np.float32
        values = [space.sample() for _ in range(3)]
        obs = conn(make_rows(values))["obs"]
        assert obs.dtype == np.float32
        np.testing.assert_array_equal(obs, np.stack(values).reshape(3, size).astype(np.float32))


def test_preprocessor_rejects_images_of_the_wrong_shape():
    conn, _ = bound(ObsPreprocessorConnector(ctx_for(RGB)), RGB)
    with pytest.raises(ConnectorError, match=r"image observations of shape \(6, 4, 3\)"):
        conn(make_rows(random_frames(2, (4, 6, 3))))


# --------------------------------------------------------------------------- GrayscaleAgentConnector


def test_grayscale_is_bt601_luma_rounded():
    conn, out_space = bound(GrayscaleAgentConnector(ctx_for(RGB)), RGB)
    assert out_space == gym.spaces.Box(0, 255, (6, 4, 1), np.uint8)
    frames = random_frames(4, RGB.shape, seed=1)
    gray = conn(make_rows(frames))["obs"]
    assert gray.dtype == np.uint8 and gray.shape == (4, 6, 4, 1)
    expected = np.stack(frames).astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert np.abs(gray[..., 0] - expected).max() <= 0.5 + 1e-4  # rounded to the nearest
    pure = np.zeros((1, 6, 4, 3), np.uint8)
    for channel, luma in enumerate((76, 150, 29)):  # 255 * 0.299, 0.587, 0.114, rounded
        pure[...] = 0
        pure[..., channel] = 255
        assert (conn(make_rows(pure))["obs"] == luma).all()
    shade = np.full((1, 6, 4, 3), 123, np.uint8)  # gray stays the same gray
    assert (conn(make_rows(shade))["obs"] == 123).all()


def test_grayscale_needs_three_channels():
    for space in (gym.spaces.Box(0, 255, (6, 4, 1), np.uint8), gym.spaces.Box(0, 1, (4,))):
        with pytest.raises(ConnectorError, match="GrayscaleAgentConnector"):
            GrayscaleAgentConnector(ctx_for(space)).bind_input_space(space)


# --------------------------------------------------------------------------- ResizeAgentConnector


def resize(frames, height, width, method, space=RGB):
    conn, out_space = bound(
        ResizeAgentConnector(ctx_for(space), height=height, width=width, method=method), space
    )
    return conn(make_rows(frames))["obs"], out_space


def bilinear_reference(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Per-pixel bilinear with aligned pixel centres, written the slow obvious way."""
    in_h, in_w, channels = image.shape
    out = np.zeros((height, width, channels))
    for i in range(height):
        y = min(max((i + 0.5) * in_h / height - 0.5, 0), in_h - 1)
        y0, fy = int(np.floor(y)), y - np.floor(y)
        for j in range(width):
            x = min(max((j + 0.5) * in_w / width - 0.5, 0), in_w - 1)
            x0, fx = int(np.floor(x)), x - np.floor(x)
            y1, x1 = min(y0 + 1, in_h - 1), min(x0 + 1, in_w - 1)
            top = (1 - fx) * image[y0, x0] + fx * image[y0, x1]
            bottom = (1 - fx) * image[y1, x0] + fx * image[y1, x1]
            out[i, j] = (1 - fy) * top + fy * bottom
    return out


def test_area_resize_by_whole_factors_is_the_block_mean():
    frames = random_frames(3, RGB.shape, seed=2)
    small, out_space = resize(frames, 3, 2, "area")
    assert out_space == gym.spaces.Box(0, 255, (3, 2, 3), np.uint8)
    blocks = np.stack(frames).astype(np.float64).reshape(3, 3, 2, 2, 2, 3).mean(axis=(2, 4))
    assert small.dtype == np.uint8
    assert np.abs(small - blocks).max() <= 0.5 + 1e-4


def test_area_resize_keeps_the_mean_for_any_factor():
    space = gym.spaces.Box(0.0, 1.0, (457, 120, 1), np.float32)  # pistonball's crop, one channel
    image = np.random.default_rng(3).random((2, 457, 120, 1), dtype=np.float32)
    small, out_space = resize(image, 84, 84, "area", space)
    assert out_space.dtype == np.float32 and small.shape == (2, 84, 84, 1)
    np.testing.assert_allclose(small.mean(axis=(1, 2, 3)), image.mean(axis=(1, 2, 3)), rtol=1e-5)
    assert small.min() >= 0.0 and small.max() <= 1.0


def test_bilinear_resize_matches_the_per_pixel_reference():
    space = gym.spaces.Box(0.0, 255.0, (7, 5, 2), np.float32)
    image = np.random.default_rng(4).random((2, 7, 5, 2), dtype=np.float32) * 255
    for height, width in ((4, 9), (3, 3), (10, 2)):
        resized, _ = resize(image, height, width, "bilinear", space)
        for row in range(2):
            expected = bilinear_reference(image[row].astype(np.float64), height, width)
            np.testing.assert_allclose(resized[row], expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("method", ["area", "bilinear"])
def test_resize_to_the_same_size_changes_nothing(method):
    frames = random_frames(2, RGB.shape, seed=5)
    same, _ = resize(frames, 6, 4, method)
    np.testing.assert_array_equal(same, np.stack(frames))
    assert np.allclose(resize_weights(6, 6, method), np.eye(6))


def test_resize_params_and_spaces_are_checked():
    with pytest.raises(ConnectorError, match="height must be an integer >= 1") as err:
        ResizeAgentConnector(ctx_for(RGB), height=0)
    assert err.value.param == "height"
    with pytest.raises(ConnectorError, match="method must be one of") as err:
        ResizeAgentConnector(ctx_for(RGB), method="cubic")
    assert err.value.param == "method"
    flat = gym.spaces.Box(0, 255, (12,), np.uint8)
    with pytest.raises(ConnectorError, match=r"Box of shape \(height, width, channels\)"):
        ResizeAgentConnector(ctx_for(flat)).bind_input_space(flat)
    with pytest.raises(ConnectorError, match="did you mean 'height'"):
        check_spec_list([{"name": "ResizeAgentConnector", "heigth": 64}], "agent")


def test_image_connectors_round_trip_through_the_registry():
    conn = get_connector("ResizeAgentConnector", ctx_for(RGB), {"height": 3, "width": 2})
    name, params = conn.to_state()
    assert name == "ResizeAgentConnector"
    assert params == {"height": 3, "width": 2, "method": "area"}
    assert get_connector(name, ctx_for(RGB), params).params() == params
    assert get_connector("GrayscaleAgentConnector", ctx_for(RGB)).to_state() == (
        "GrayscaleAgentConnector",
        {},
    )


def test_the_chain_hands_the_policy_the_processed_space():
    ctx = ctx_for(
        gym.spaces.Box(0, 255, (457, 120, 3), np.uint8),
        view_requirements={"obs": {"frames": 4}},
    )
    chain = build_pipeline(
        [
            "ObsPreprocessorConnector",
            "GrayscaleAgentConnector",
            {"name": "ResizeAgentConnector", "height": 84, "width": 84},
            "ViewRequirementAgentConnector",
        ],
        ctx,
    )
    assert chain.output_observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    frames = random_frames(3, (457, 120, 3), seed=6)
    rows = make_rows(frames, is_first=[True] * 3)
    obs = chain(rows)["obs"]
    assert obs.dtype == np.uint8 and obs.shape == (3, 84, 84, 4)
    assert (obs[..., :3] == 0).all() and obs[..., 3].any()  # three zero frames, then the first


# --------------------------------------------------------------------------- frame stacking


def stacker(space: gym.Space, frames: int) -> tuple[ViewRequirementAgentConnector, gym.Space]:
    ctx = ctx_for(space, view_requirements={"obs": {"frames": frames}})
    return bound(ViewRequirementAgentConnector(ctx), space)


def test_images_stack_on_the_channel_axis_and_stay_uint8():
    space = gym.spaces.Box(0, 255, (2, 3, 2), np.uint8)
    conn, out_space = stacker(space, 3)
    assert out_space == gym.spaces.Box(0, 255, (2, 3, 6), np.uint8)

    def step(values, keys, is_first):
        obs = np.stack([np.full(space.shape, v, np.uint8) for v in values])
        stacked = conn(make_rows(obs, keys=keys, is_first=is_first))["obs"]
        assert stacked.dtype == np.uint8 and stacked.shape == (len(values), 2, 3, 6)
        # Each frame fills its C=2 channels: read one value per frame, oldest first.
        frames = stacked.reshape(len(values), 2, 3, 3, 2)
        assert (frames == frames[:, :1, :1, :, :1]).all()
        return frames[:, 0, 0, :, 0]

    np.testing.assert_array_equal(step([1, 5], [0, 1], [True, True]), [[0, 0, 1], [0, 0, 5]])
    np.testing.assert_array_equal(step([2], [0], [False]), [[0, 1, 2]])
    np.testing.assert_array_equal(step([3, 6], [0, 1], [False, False]), [[1, 2, 3], [0, 5, 6]])
    np.testing.assert_array_equal(step([4], [0], [False]), [[2, 3, 4]])
    # key 0 starts a new episode: nothing of the old one leaks in; key 1 goes on
    np.testing.assert_array_equal(step([7, 8], [0, 1], [True, False]), [[0, 0, 7], [5, 6, 8]])


def test_stacked_frames_are_the_last_k_observations_of_each_key():
    space = gym.spaces.Box(0, 255, (3, 2, 1), np.uint8)
    frames = 4
    conn, _ = stacker(space, frames)
    rng = np.random.default_rng(7)
    history: dict[int, list[np.ndarray]] = {}
    for round_index in range(30):
        keys = rng.choice(6, size=rng.integers(1, 6), replace=False)
        is_first = (rng.random(len(keys)) < 0.15) | np.array([k not in history for k in keys])
        obs = rng.integers(0, 256, (len(keys), *space.shape), dtype=np.uint8)
        stacked = conn(make_rows(obs, keys=keys, is_first=is_first))["obs"]
        for row, key in enumerate(keys.tolist()):
            if is_first[row]:
                history[key] = []
            history[key].append(obs[row])
            last = history[key][-frames:]
            padding = [np.zeros(space.shape, np.uint8)] * (frames - len(last))
            np.testing.assert_array_equal(
                stacked[row],
                np.concatenate(padding + last, axis=-1),
                err_msg=f"round {round_index}",
            )


def test_non_image_boxes_still_stack_on_a_new_leading_axis():
    space = gym.spaces.Box(0.0, 1.0, (2, 3, 2), np.float32)  # rank 3 but not uint8
    conn, out_space = stacker(space, 2)
    assert out_space.shape == (2, 2, 3, 2) and out_space.dtype == np.float32


def test_an_output_observation_of_more_than_max_obs_values_is_refused_before_it_is_made():
    """A resize to 20,000 x 20,000 (or 100,000 stacked frames) built a space whose bounds
    alone took gigabytes before anything ran."""
    with pytest.raises(ConnectorError, match=r"\(20000, 20000, 3\) would hold 1,200,000,000 values"):
        ResizeAgentConnector(ctx_for(RGB), height=20_000, width=20_000).bind_input_space(RGB)
    most = ResizeAgentConnector(ctx_for(RGB), height=MAX_OBS_VALUES // 3, width=1)
    assert most.output_observation_space(RGB).shape == (MAX_OBS_VALUES // 3, 1, 3)
    frames = MAX_OBS_VALUES // 72 + 1  # RGB is 72 values
    with pytest.raises(ConnectorError, match=rf"\({frames} frames\).* more than the 16,777,216"):
        stacker(RGB, frames)
