"""Raw env observations -> one float32 matrix (or uint8 images), with action masks put aside."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.agent.images import is_image_space
from connectors.base import AgentConnector, ConnectorContext
from connectors.data import AgentRows
from connectors.errors import ConnectorError

#: Key of a Dict observation (and of an info dict) that holds the legal-action mask.
ACTION_MASK = "action_mask"

Encoder = Callable[[Any, int], np.ndarray]

#: Observation size from which stacking by concatenation beats ``np.asarray``.
_LARGE_OBS = 1024
_SHAPE = attrgetter("shape")


@dataclass
class _Encoding:
    """How to turn n raw values of one (sub)space into a float32 [n, size] block."""

    encode: Encoder
    low: np.ndarray
    high: np.ndarray


def _all_of_shape(values: list, shape: tuple) -> bool:
    """Whether every value is an array of ``shape``: each row checked, as a total alone
    would let one row's extra value shift the next row's (a microsecond per round, against
    copying kilobytes per row)."""
    return set(map(type, values)) == {np.ndarray} and set(map(_SHAPE, values)) == {shape}


def _box(space: gym.spaces.Box, path: str) -> _Encoding:
    shape = space.shape
    size = int(np.prod(shape))

    def encode(values: Any, n: int) -> np.ndarray:
        if size >= _LARGE_OBS and isinstance(values, list) and _all_of_shape(values, shape):
            # For big observations (images) one concatenate is ~3x faster than asarray.
            flat = np.concatenate(values, axis=None)
            if flat.dtype != object:
                return flat.astype(np.float32, copy=False).reshape(n, size)
        try:
            array = np.asarray(values, dtype=np.float32)
        except ValueError as err:
            raise ConnectorError(
                f"{path}: observations do not stack to shape {shape}: {err}"
            ) from None
        if array.shape != (n, *shape):
            raise ConnectorError(
                f"{path}: expected {n} observations of shape {shape} for {space}, "
                f"got an array of shape {array.shape}"
            )
        return array.reshape(n, size)

    return _Encoding(
        encode, space.low.astype(np.float32).ravel(), space.high.astype(np.float32).ravel()
    )


def _image(space: gym.spaces.Box, path: str) -> _Encoding:
    """uint8 ``(H, W, C)`` frames stay as they are: one ``[n, H, W, C]`` uint8 array."""
    shape = space.shape

    def encode(values: Any, n: int) -> np.ndarray:
        try:
            array = np.stack(values) if isinstance(values, list) else np.asarray(values)
        except ValueError as err:
            raise ConnectorError(
                f"{path}: image observations do not stack to shape {shape}: {err}"
            ) from None
        if array.shape != (n, *shape):
            raise ConnectorError(
                f"{path}: expected {n} image observations of shape {shape} for {space}, "
                f"got an array of shape {array.shape}"
            )
        return array.astype(np.uint8, copy=False)

    return _Encoding(encode, space.low, space.high)


def _check_range(path: str, index: np.ndarray, sizes: np.ndarray | int, space: gym.Space) -> None:
    if ((index < 0) | (index >= sizes)).any():
        raise ConnectorError(f"{path}: observation values outside {space}")


def _discrete(space: gym.spaces.Discrete, path: str) -> _Encoding:
    size, start = int(space.n), int(space.start)

    def encode(values: Any, n: int) -> np.ndarray:
        index = np.asarray(values, dtype=np.int64).reshape(n) - start
        _check_range(path, index, size, space)
        one_hot = np.zeros((n, size), dtype=np.float32)
        one_hot[np.arange(n), index] = 1.0
        return one_hot

    return _Encoding(encode, np.zeros(size, np.float32), np.ones(size, np.float32))


def _multi_discrete(space: gym.spaces.MultiDiscrete, path: str) -> _Encoding:
    sizes = space.nvec.astype(np.int64).ravel()
    starts = space.start.astype(np.int64).ravel()
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    total = int(sizes.sum())

    def encode(values: Any, n: int) -> np.ndarray:
        index = np.asarray(values, dtype=np.int64).reshape(n, len(sizes)) - starts
        _check_range(path, index, sizes, space)
        one_hot = np.zeros((n, total), dtype=np.float32)
        one_hot[np.arange(n)[:, None], index + offsets] = 1.0
        return one_hot

    return _Encoding(encode, np.zeros(total, np.float32), np.ones(total, np.float32))


def _multi_binary(space: gym.spaces.MultiBinary, path: str) -> _Encoding:
    size = int(np.prod(space.shape))

    def encode(values: Any, n: int) -> np.ndarray:
        return np.asarray(values, dtype=np.float32).reshape(n, size)

    return _Encoding(encode, np.zeros(size, np.float32), np.ones(size, np.float32))


def _concat(parts: Sequence[tuple[Any, _Encoding]], path: str) -> _Encoding:
    """Sub-encodings of a Dict/Tuple, concatenated in the space's (fixed) key order."""

    def encode(values: Any, n: int) -> np.ndarray:
        if not parts:
            return np.zeros((n, 0), dtype=np.float32)
        try:
            blocks = [enc.encode([value[key] for value in values], n) for key, enc in parts]
        except (KeyError, IndexError, TypeError) as err:
            raise ConnectorError(f"{path}: observation lacks part {err}") from None
        # Each block is a fresh array: one part (a Dict obs beside its mask) needs no copy.
        return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)

    low = np.concatenate([np.zeros(0, np.float32)] + [enc.low for _, enc in parts])
    high = np.concatenate([np.zeros(0, np.float32)] + [enc.high for _, enc in parts])
    return _Encoding(encode, low, high)


def _compile(space: gym.Space, path: str) -> _Encoding:
    if isinstance(space, gym.spaces.Box):
        return _box(space, path)
    if isinstance(space, gym.spaces.Discrete):
        return _discrete(space, path)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return _multi_discrete(space, path)
    if isinstance(space, gym.spaces.MultiBinary):
        return _multi_binary(space, path)
    if isinstance(space, gym.spaces.Dict):
        return _concat([(k, _compile(s, f"{path}[{k!r}]")) for k, s in space.spaces.items()], path)
    if isinstance(space, gym.spaces.Tuple):
        return _concat([(i, _compile(s, f"{path}[{i}]")) for i, s in enumerate(space.spaces)], path)
    raise ConnectorError(
        f"ObsPreprocessorConnector cannot encode {path} of space {space}: "
        "expected Box, Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of those"
    )


def _action_mask_width(space: gym.Space) -> int | None:
    """Width of a mask over ``space``'s actions, for masks that arrive in infos."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    return None


class ObsPreprocessorConnector(AgentConnector):
    """Turns the ``obs`` column (raw env observations) into float32 ``[n, d]``.

    Box observations are flattened, Discrete/MultiDiscrete one-hot encoded,
    Dict/Tuple flattened part by part in the space's key order. Image
    observations (a uint8 Box ``(H, W, C)``, see ``is_image_space``) are the
    exception: they stay uint8 ``[n, H, W, C]``, 4x smaller in every batch,
    and the model scales them (a flat model flattens them itself). An
    ``action_mask`` entry of a Dict observation, or of a row's info dict (the
    two ways PettingZoo envs hand out masks), goes to an int8 ``action_mask``
    column ``[n, A]`` instead, so the policy can honour it; rows without a
    mask get all-ones. Whether the column exists depends only on the spaces,
    so it never comes and goes between rounds: it does when the observation
    space has an ``action_mask``, or when masks are taken from infos and the
    action space is Discrete/MultiDiscrete/MultiBinary (A = n, sum(nvec),
    size). ``masks_from_infos``: ``"auto"`` (default) decides once, on the
    first rows seen, by whether any info holds a mask, so envs that never
    give masks pay nothing; ``True`` / ``False`` force it.

    Reads: ``obs``, ``infos``. Writes: ``obs``, ``action_mask``.
    """

    def __init__(self, ctx: ConnectorContext, masks_from_infos: bool | str = "auto") -> None:
        super().__init__(ctx)
        if masks_from_infos not in (True, False, "auto"):
            raise ConnectorError(
                f"ObsPreprocessorConnector: masks_from_infos must be true, false or 'auto', "
                f"got {masks_from_infos!r}",
                param="masks_from_infos",
            )
        self.masks_from_infos = masks_from_infos
        self._encoding: _Encoding | None = None
        self._empty: np.ndarray | None = None  # what a round without rows outputs
        self._obs_has_mask = False
        self._obs_mask_width = 0
        self._info_mask_width = (
            _action_mask_width(ctx.action_space) if masks_from_infos is not False else None
        )
        self._decided = masks_from_infos != "auto"

    def params(self) -> dict[str, Any]:
        return {"masks_from_infos": self.masks_from_infos}

    @staticmethod
    def _split_mask(space: gym.Space) -> tuple[gym.Space, gym.Space | None]:
        if isinstance(space, gym.spaces.Dict) and ACTION_MASK in space.spaces:
            rest = {k: s for k, s in space.spaces.items() if k != ACTION_MASK}
            return gym.spaces.Dict(rest), space.spaces[ACTION_MASK]
        return space, None

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        obs_space, _ = self._split_mask(space)
        if is_image_space(obs_space):
            return obs_space
        encoding = _compile(obs_space, "obs")
        return gym.spaces.Box(encoding.low, encoding.high, dtype=np.float32)

    def bind_input_space(self, space: gym.Space) -> gym.Space:
        out = super().bind_input_space(space)
        obs_space, mask_space = self._split_mask(space)
        self._encoding = (
            _image(obs_space, "obs") if is_image_space(obs_space) else _compile(obs_space, "obs")
        )
        self._empty = np.zeros((0, *out.shape), out.dtype)
        self._obs_has_mask = mask_space is not None
        if mask_space is not None:
            self._obs_mask_width = int(np.prod(mask_space.shape))
        return out

    def __call__(self, rows: AgentRows) -> AgentRows:
        if self._encoding is None:
            self.bind_input_space(self.input_observation_space)
        obs = rows["obs"]
        n = len(obs)
        if self._obs_has_mask:
            # The encoding reads only the other keys, so the mask needs no stripping.
            rows["action_mask"] = self._masks_from_obs(obs, n)
        elif self._info_mask_width is not None:
            if not self._decided and n:
                self._decide_from(rows.get("infos"))
            if self._info_mask_width is not None:
                rows["action_mask"] = self._masks_from_infos(rows.get("infos"), n)
        if n == 0:
            rows["obs"] = self._empty
            return rows
        try:
            rows["obs"] = self._encoding.encode(obs, n)
        except ConnectorError as err:
            raise ConnectorError(f"ObsPreprocessorConnector: {err}") from None
        return rows

    def _decide_from(self, infos: Sequence[Any] | None) -> None:
        """``auto``: masks come from infos from now on iff some info holds one now."""
        self._decided = True
        if not any(info and ACTION_MASK in info for info in infos or ()):
            self._info_mask_width = None

    def _masks_from_obs(self, obs: Sequence[Any], n: int) -> np.ndarray:
        try:
            masks = np.asarray([o[ACTION_MASK] for o in obs], dtype=np.int8)
            return masks.reshape(n, self._obs_mask_width)
        except (KeyError, TypeError, ValueError) as err:
            raise ConnectorError(
                f"ObsPreprocessorConnector: every observation must hold an {ACTION_MASK!r} of "
                f"{self._obs_mask_width} entries as its space says ({err})"
            ) from None

    def _masks_from_infos(self, infos: Sequence[Any] | None, n: int) -> np.ndarray:
        found = [i for i, info in enumerate(infos or ()) if info and ACTION_MASK in info]
        width = self._info_mask_width
        masks = np.ones((n, width), dtype=np.int8)
        if found:
            values = np.asarray([infos[i][ACTION_MASK] for i in found], dtype=np.int8)
            if values.size != len(found) * width:
                raise ConnectorError(
                    f"ObsPreprocessorConnector: info {ACTION_MASK!r} must have {width} entries "
                    f"(one per action of {self.ctx.action_space}), got shape {values.shape[1:]}"
                )
            masks[found] = values.reshape(len(found), width)
        return masks
