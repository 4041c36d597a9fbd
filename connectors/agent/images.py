"""Image observations: what counts as one, and grayscale / resize connectors.

An *image space* is a ``Box`` of shape ``(H, W, C)`` (channels last) and
dtype ``uint8``, e.g. PettingZoo's pistonball or cooperative_pong frames.
Such observations travel as ``uint8`` arrays of their own shape from env to
batch (4x smaller than float32, and not flattened), and the model scales
them to [0, 1]. The connectors here work on whole rounds at once: one numpy
call per round for all rows, no per-row Python.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentRows
from connectors.errors import ConnectorError, check_obs_size

__all__ = [
    "GrayscaleAgentConnector",
    "ResizeAgentConnector",
    "is_image_space",
    "resize_weights",
]

#: ITU-R BT.601 luma weights (what PIL's ``convert("L")`` and OpenCV use).
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
RESIZE_METHODS = ("area", "bilinear")


def is_image_space(space: gym.Space) -> bool:
    """A channels-last ``uint8`` Box ``(H, W, C)``: kept as uint8 pixels, not flattened."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def _check_hwc_box(name: str, space: gym.Space) -> gym.spaces.Box:
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3):
        raise ConnectorError(
            f"{name} takes image observations, a Box of shape (height, width, channels), "
            f"got {space}"
        )
    return space


def _pixels(name: str, obs: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The round's observations as one ``[n, H, W, C]`` array (no copy when already one)."""
    if len(obs) == 0:
        return np.zeros((0, *shape), np.float32)
    array = np.stack(obs) if isinstance(obs, list) else np.asarray(obs)
    if array.shape[1:] != shape:
        raise ConnectorError(
            f"{name}: expected observations of shape {shape}, got rows of shape {array.shape[1:]}"
        )
    return array


def _cast_like(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 results back to the input's dtype: uint8 pixels are rounded, floats kept."""
    if np.issubdtype(dtype, np.integer):
        return np.rint(values).astype(dtype)
    return values.astype(dtype, copy=False)


def _box_like(space: gym.spaces.Box, shape: tuple[int, ...]) -> gym.spaces.Box:
    """A Box of ``shape`` whose bounds cover ``space``'s (uint8 stays Box(0, 255))."""
    return gym.spaces.Box(
        np.full(shape, space.low.min(), space.dtype),
        np.full(shape, space.high.max(), space.dtype),
        dtype=space.dtype,
    )


class GrayscaleAgentConnector(AgentConnector):
    """RGB image observations ``(H, W, 3)`` to luma ``(H, W, 1)``, same dtype.

    Luma is ``0.299 R + 0.587 G + 0.114 B`` (ITU-R BT.601), rounded for
    uint8. The channel axis is kept so the frame stack and the CNN see
    channels last as for any image.

    Reads and writes: ``obs``.
    """

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        box = _check_hwc_box("GrayscaleAgentConnector", space)
        if box.shape[2] != 3:
            raise ConnectorError(
                f"GrayscaleAgentConnector takes RGB images with 3 channels, got {box} "
                f"({box.shape[2]} channels)"
            )
        return _box_like(box, (*box.shape[:2], 1))

    def __call__(self, rows: AgentRows) -> AgentRows:
        space = self.input_observation_space
        pixels = _pixels("GrayscaleAgentConnector", rows["obs"], space.shape)
        luma = pixels.astype(np.float32, copy=False) @ _LUMA  # [n, H, W]: the whole round at once
        rows["obs"] = _cast_like(luma, space.dtype)[..., None]
        return rows


def resize_weights(in_size: int, out_size: int, method: str) -> np.ndarray:
    """``[out_size, in_size]`` float32 matrix mapping one image axis to its resized length.

    ``area``: each output pixel is the mean of the input over its footprint
    (fractional pixels weighted by overlap): the right choice to shrink.
    ``bilinear``: interpolation between the two nearest input pixels, pixel
    centres aligned (``(i + 0.5) * in / out - 0.5``, edges clamped), as
    OpenCV's ``INTER_LINEAR``. Rows sum to 1, so values stay in range.
    """
    scale = in_size / out_size
    if method == "area":
        edges = np.arange(out_size + 1, dtype=np.float64) * scale
        starts = np.arange(in_size, dtype=np.float64)
        overlap = np.minimum(edges[1:, None], starts + 1) - np.maximum(edges[:-1, None], starts)
        return (np.clip(overlap, 0.0, None) / scale).astype(np.float32)
    if method == "bilinear":
        centres = np.clip((np.arange(out_size) + 0.5) * scale - 0.5, 0, in_size - 1)
        left = np.floor(centres).astype(np.int64)
        right = np.minimum(left + 1, in_size - 1)
        frac = centres - left
        weights = np.zeros((out_size, in_size), np.float64)
        rows = np.arange(out_size)
        np.add.at(weights, (rows, left), 1.0 - frac)
        np.add.at(weights, (rows, right), frac)
        return weights.astype(np.float32)
    raise ConnectorError(f"unknown resize method {method!r}; expected one of {RESIZE_METHODS}")


class ResizeAgentConnector(AgentConnector):
    """Resizes image observations ``(H, W, C)`` to ``(height, width, C)``, same dtype.

    ``method``: ``area`` (default; averages each output pixel's footprint,
    no aliasing when shrinking) or ``bilinear`` (see :func:`resize_weights`).
    Both are separable and banded: a few weighted gathers per axis per round,
    over all rows at once, numpy only. Put a ``GrayscaleAgentConnector`` first when both are
    used: resizing one channel is 3x cheaper than three.

    Reads and writes: ``obs``.
    """

    def __init__(
        self, ctx: ConnectorContext, height: int = 84, width: int = 84, method: str = "area"
    ) -> None:
        super().__init__(ctx)
        for param, value in (("height", height), ("width", width)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ConnectorError(
                    f"ResizeAgentConnector: {param} must be an integer >= 1, got {value!r}",
                    param=param,
                )
        if method not in RESIZE_METHODS:
            raise ConnectorError(
                f"ResizeAgentConnector: method must be one of {RESIZE_METHODS}, got {method!r}",
                param="method",
            )
        self.height, self.width, self.method = int(height), int(width), method
        self._taps: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None

    def params(self) -> dict[str, Any]:
        return {"height": self.height, "width": self.width, "method": self.method}

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        box = _check_hwc_box("ResizeAgentConnector", space)
        shape = (self.height, self.width, box.shape[2])
        check_obs_size("ResizeAgentConnector", shape, "height")
        return _box_like(box, shape)

    def bind_input_space(self, space: gym.Space) -> gym.Space:
        out = super().bind_input_space(space)
        in_height, in_width, _ = space.shape
        self._taps = (
            _taps(resize_weights(in_height, self.height, self.method)),
            _taps(resize_weights(in_width, self.width, self.method)),
        )
        return out

    def __call__(self, rows: AgentRows) -> AgentRows:
        if self._taps is None:
            self.bind_input_space(self.input_observation_space)
        space = self.input_observation_space
        pixels = _pixels("ResizeAgentConnector", rows["obs"], space.shape)
        height_taps, width_taps = self._taps
        resized = _apply_taps(_apply_taps(pixels, 1, *height_taps), 2, *width_taps)
        rows["obs"] = _cast_like(resized, space.dtype)
        return rows


def _taps(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A banded resize matrix as ``(index, weight)``, each ``[out, k]``: its k nonzeros per row.

    Shrinking 457 rows to 84 touches at most 7 input rows per output row, so
    k gathers beat a dense product over all 457 (about 4x on pistonball).
    """
    nonzero = weights > 0
    first = nonzero.argmax(axis=1)
    width = int(nonzero.sum(axis=1).max())
    position = first[:, None] + np.arange(width)
    index = np.minimum(position, weights.shape[1] - 1)
    tap_weights = np.where(
        position < weights.shape[1], np.take_along_axis(weights, index, axis=1), 0.0
    )
    return index, tap_weights.astype(np.float32)


def _apply_taps(
    pixels: np.ndarray, axis: int, index: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """``pixels`` ``[n, H, W, C]`` resized along ``axis`` (1: height, 2: width), as float32."""
    shape = [1, 1, 1, 1]
    shape[axis] = len(index)
    resized = np.zeros(pixels.shape[:axis] + (len(index),) + pixels.shape[axis + 1 :], np.float32)
    for k in range(index.shape[1]):
        resized += np.take(pixels, index[:, k], axis=axis) * weights[:, k].reshape(shape)
    return resized
