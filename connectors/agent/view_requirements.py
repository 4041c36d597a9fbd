"""Previous action, previous reward and frame stacking, as the policy asks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.agent.images import is_image_space
from connectors.agent.keyed import KeyedArray
from connectors.base import AgentConnector, ConnectorContext
from connectors.data import ActionRows, AgentRows
from connectors.errors import ConnectorError, check_obs_size


def _stacked_frames(view_requirements: Mapping[str, Any] | None) -> int:
    """How many observations ``{"obs": {"frames": k}}`` asks to stack (1 = none)."""
    request = (view_requirements or {}).get("obs")
    if not request:
        return 1
    frames = request.get("frames", 1) if isinstance(request, Mapping) else None
    if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
        raise ConnectorError(
            f"view_requirements['obs'] must look like {{'frames': k}} with an int k >= 1, got {request!r}"
        )
    return frames


def _requests(view_requirements: Mapping[str, Any] | None) -> tuple[bool, bool, int]:
    """What this connector has to do: (prev_actions, prev_rewards, frames)."""
    view_requirements = view_requirements or {}
    return (
        "prev_actions" in view_requirements,
        "prev_rewards" in view_requirements,
        _stacked_frames(view_requirements),
    )


def _action_layout(space: gym.Space) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of one action of ``space`` (for the previous-action table)."""
    if isinstance(space, gym.spaces.Discrete):
        return (), np.int64
    if isinstance(space, gym.spaces.MultiDiscrete):
        return space.nvec.shape, np.int64
    if isinstance(space, gym.spaces.MultiBinary):
        return tuple(space.shape), np.int8
    if isinstance(space, gym.spaces.Box):
        return space.shape, space.dtype
    raise ConnectorError(
        f"ViewRequirementAgentConnector: prev_actions needs a Discrete, MultiDiscrete, "
        f"MultiBinary or Box action space, got {space}"
    )


class ViewRequirementAgentConnector(AgentConnector):
    """Adds what ``ctx.view_requirements`` asks for beyond the current observation.

    - ``"prev_actions"``: column ``prev_actions``, the raw action the policy
      took for this trajectory key last time (zeros at the episode start),
      remembered in ``on_policy_output``. The runner passes the raw policy
      output (or the env's off-policy action) there, not the env-bound one.
    - ``"prev_rewards"``: column ``prev_rewards`` = this row's ``rewards``
      (0 on ``is_first`` rows). The ``rewards`` column holds the reward that
      followed the agent's previous action, so this is RLlib's convention:
      in a built batch ``prev_rewards[t] == rewards[t - 1]`` within a
      trajectory, and 0 at its start. It reads ``rewards`` as it is at this
      point of the chain (after a reward clipper placed before it).
    - ``{"obs": {"frames": k}}``: ``obs`` becomes ``[n, k, *obs_shape]``, the
      last k observations of the key, oldest first, zero-padded at the episode
      start. Needs a Box input space; the output space's bounds include 0.
      Image observations (uint8 ``(H, W, C)``, see ``is_image_space``) are
      stacked on the channel axis instead and stay uint8: ``[n, H, W, k*C]``,
      channels ``[i*C:(i+1)*C]`` holding frame ``t - (k - 1) + i``, as a CNN
      takes them.

    Other keys are ignored. With none of these set the connector returns its
    input untouched. ``view_requirements`` are re-read when they change, but
    changing ``frames`` after the pipeline was built is an error (the policy's
    input space would change under it).

    Reads: ``keys``, ``is_first``, ``rewards``, ``obs``.
    Writes: ``prev_actions``, ``prev_rewards``, ``obs``.
    """

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self._configured_for: tuple[bool, bool, int] | None = None  # None: not yet
        self._bound_frames: int | None = None
        self._prev_actions: KeyedArray | None = None
        self._prev_rewards = False
        self._frames: KeyedArray | None = None

    def _configure(self, requests: tuple[bool, bool, int]) -> None:
        prev_actions, prev_rewards, frames = requests
        if self._bound_frames is not None and frames != self._bound_frames:
            raise ConnectorError(
                f"ViewRequirementAgentConnector: view_requirements['obs']['frames'] changed from "
                f"{self._bound_frames} to {frames} after the pipeline was built; call its refresh_spaces()"
            )
        self._configured_for = requests
        self._prev_actions = (
            KeyedArray(*_action_layout(self.ctx.action_space)) if prev_actions else None
        )
        self._prev_rewards = prev_rewards
        self._frames = None
        if frames > 1:
            stacked = self.output_observation_space(self.input_observation_space)  # Box or raise
            self._frames = KeyedArray(stacked.shape, stacked.dtype)

    def output_observation_space(self, space: gym.Space) -> gym.Space:
        frames = _stacked_frames(self.ctx.view_requirements)
        if frames == 1:
            return space
        if not isinstance(space, gym.spaces.Box):
            raise ConnectorError(
                f"ViewRequirementAgentConnector stacks frames of Box observations only, got {space}"
            )
        check_obs_size(
            f"ViewRequirementAgentConnector ({frames} frames)", (frames, *space.shape)
        )
        low, high = np.minimum(space.low, 0), np.maximum(space.high, 0)
        if is_image_space(space):
            tiles = (1, 1, frames)
            return gym.spaces.Box(np.tile(low, tiles), np.tile(high, tiles), dtype=space.dtype)
        low = np.broadcast_to(low, (frames, *space.shape))
        high = np.broadcast_to(high, (frames, *space.shape))
        return gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)

    def bind_input_space(self, space: gym.Space) -> gym.Space:
        moved = space != self._input_space
        out = super().bind_input_space(space)
        requests = _requests(self.ctx.view_requirements)
        if moved or requests != self._configured_for:  # keep history over no-op re-binds
            self._bound_frames = None
            self._configure(requests)
        self._bound_frames = requests[2]
        return out

    def _refresh(self) -> None:
        """Follow changes of ``ctx.view_requirements`` (cheap: three lookups)."""
        requests = _requests(self.ctx.view_requirements)
        if requests != self._configured_for:
            self._configure(requests)

    def __call__(self, rows: AgentRows) -> AgentRows:
        self._refresh()
        if self._prev_actions is None and not self._prev_rewards and self._frames is None:
            return rows
        keys = np.asarray(rows["keys"], dtype=np.int64)
        is_first = np.asarray(rows["is_first"], dtype=np.bool_)
        if self._prev_actions is not None:
            table = self._prev_actions
            table.ensure(keys)
            table.data[keys[is_first]] = 0
            rows["prev_actions"] = table.data[keys]
        if self._prev_rewards:
            rewards = np.asarray(rows["rewards"], dtype=np.float32)
            rows["prev_rewards"] = np.where(is_first, np.float32(0), rewards)
        if self._frames is not None:
            rows["obs"] = self._stack(rows["obs"], keys, is_first)
        return rows

    def _stack(self, obs: Any, keys: np.ndarray, is_first: np.ndarray) -> np.ndarray:
        table = self._frames
        space = self.input_observation_space
        obs = np.asarray(obs, dtype=table.data.dtype)
        if obs.shape[1:] != space.shape:
            raise ConnectorError(
                f"ViewRequirementAgentConnector: expected observations of shape "
                f"{space.shape} to stack, got {obs.shape[1:]}"
            )
        table.ensure(keys)
        history = table.data[keys]
        history[is_first] = 0
        if is_image_space(space):  # drop the oldest frame's channels, append the new ones
            stacked = np.concatenate([history[..., space.shape[-1] :], obs], axis=-1)
        else:
            stacked = np.concatenate([history[:, 1:], obs[:, None]], axis=1)
        table.data[keys] = stacked
        return stacked

    def on_policy_output(self, output: ActionRows) -> None:
        self._refresh()
        if self._prev_actions is None:
            return
        keys = np.asarray(output.keys, dtype=np.int64)
        table = self._prev_actions
        table.ensure(keys)
        try:
            table.data[keys] = np.asarray(output.actions)
        except ValueError as err:
            raise ConnectorError(
                f"ViewRequirementAgentConnector: actions do not fit {self.ctx.action_space} "
                f"for prev_actions ({err})"
            ) from None
