"""Action distributions as plain torch ops on batched tensors.

Building ``torch.distributions`` objects on every call costs more than the
arithmetic itself at a few hundred rows, so each head computes distribution
inputs, samples and log-probabilities directly. ``log_prob`` and
``entropy`` are differentiable, so a trainer can reuse them on stored
``action_dist_inputs`` or on a fresh forward pass.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from marl_runner.policy.action_spaces import action_feature_size, multidiscrete_layout

__all__ = [
    "ActionHead",
    "CategoricalHead",
    "DiagGaussianHead",
    "MultiCategoricalHead",
    "make_action_head",
]

# Masked logits get the most negative finite float rather than -inf, so that
# softmax/entropy over stored dist inputs stay free of NaNs (0 * -inf).
FLOAT_MIN = torch.finfo(torch.float32).min
_LOG_2PI = math.log(2.0 * math.pi)


# Smallest positive normal float per dtype (uniforms are clamped to it so that no log is
# -inf), looked up once rather than building torch.finfo on every call.
_TINY = {
    dtype: torch.finfo(dtype).tiny
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


def _negated_gumbel_noise(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Minus Gumbel(0, 1) noise, ``log(-log(u))``: argmax(logits - this) samples the
    categorical exactly. Built in place (each small op costs more than its arithmetic)."""
    uniform = torch.rand(like.shape, generator=generator, device=like.device, dtype=like.dtype)
    tiny = _TINY.get(like.dtype) or torch.finfo(like.dtype).tiny
    return uniform.clamp_(min=tiny).log_().neg_().log_()


def _scores(logits: torch.Tensor, explore: bool, generator: torch.Generator) -> torch.Tensor:
    """Logits, plus Gumbel noise when exploring: the argmax of these is the action."""
    return torch.sub(logits, _negated_gumbel_noise(logits, generator)) if explore else logits


def _argmax_allowed(scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Index of the best allowed entry along the last dim.

    Disallowed entries are forced to -inf after any noise was added, so they
    can never win, whatever the logits are.
    """
    if allowed is not None:
        scores = torch.where(allowed, scores, -math.inf)  # one op; masked_fill needs ~allowed
    return scores.argmax(dim=-1)


class ActionHead(nn.Module):
    """Turns model outputs into actions, log-probs and distribution inputs for one space."""

    num_model_outputs: int

    def distribution_inputs(
        self, model_out: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The ``action_dist_inputs`` column: what fully defines the action distribution."""
        raise NotImplementedError

    def sample(
        self,
        dist_inputs: torch.Tensor,
        mask: torch.Tensor | None,
        explore: bool,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Actions in the space's own units (``start`` offsets applied), first dim n."""
        raise NotImplementedError

    def log_prob(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability ``[n]`` of ``actions`` under ``dist_inputs``."""
        raise NotImplementedError

    def entropy(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        """Entropy ``[n]`` of the distribution (summed over action dimensions)."""
        raise NotImplementedError

    def act(
        self,
        model_out: torch.Tensor,
        mask: torch.Tensor | None,
        explore: bool,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(actions, logp, dist_inputs)`` for one sampling call: what the policy returns.

        One entry point per call so that a head can share work between the
        three (the categorical head does); the result equals calling
        :meth:`distribution_inputs`, :meth:`sample` and :meth:`log_prob` in turn.
        """
        dist_inputs = self.distribution_inputs(model_out, mask)
        actions = self.sample(dist_inputs, mask, explore, generator)
        return actions, self.log_prob(dist_inputs, actions), dist_inputs


# From this many rows on, a log_softmax over fewer than _NARROW_ROW actions runs on the
# transposed [actions, rows] view: over a short last dim the CPU kernel works one row at a
# time (~70 ns per row of 5), over the first dim it vectorises across rows (~10x faster at
# 256 rows). Below it, or from _NARROW_ROW actions on, the plain last-dim kernel is faster.
_TRANSPOSED_MIN_ROWS = 32
_NARROW_ROW = 16


def _log_softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits, -1)`` of ``[n, k]``, by the faster CPU kernel for the shape.

    Same values either way up to float rounding (last bits may differ between batch
    sizes that take different kernels).
    """
    num_rows, width = logits.shape
    if width < _NARROW_ROW and num_rows >= _TRANSPOSED_MIN_ROWS and logits.device.type == "cpu":
        return torch.log_softmax(logits.t(), 0).t()
    return torch.log_softmax(logits, -1)


def _categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dim; entries of zero probability (masked) add exactly 0."""
    log_probs = torch.log_softmax(logits, -1)
    probs = log_probs.exp()
    return -(probs * log_probs).masked_fill(probs == 0, 0.0).sum(-1)


class _MaskedLogitsHead(ActionHead):
    """Heads whose distribution inputs are logits: masked entries get the lowest float."""

    def distribution_inputs(
        self, model_out: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return model_out if mask is None else torch.where(mask, model_out, FLOAT_MIN)


class CategoricalHead(_MaskedLogitsHead):
    """Discrete(n): one categorical over n logits."""

    def __init__(self, space: gym.spaces.Discrete) -> None:
        super().__init__()
        self.num_model_outputs = int(space.n)
        self.start = int(space.start)

    def sample(
        self,
        dist_inputs: torch.Tensor,
        mask: torch.Tensor | None,
        explore: bool,
        generator: torch.Generator,
    ) -> torch.Tensor:
        actions = _argmax_allowed(_scores(dist_inputs, explore, generator), mask)
        return actions + self.start if self.start else actions

    def log_prob(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        index = (actions.long() - self.start if self.start else actions.long()).unsqueeze(-1)
        return _log_softmax_rows(dist_inputs).gather(-1, index).squeeze(-1)

    def act(
        self,
        model_out: torch.Tensor,
        mask: torch.Tensor | None,
        explore: bool,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The three steps inlined: within a policy call every Python layer and small op
        # counts (the model's forward pass has just evicted the caches).
        dist_inputs = model_out if mask is None else torch.where(mask, model_out, FLOAT_MIN)
        index = _argmax_allowed(_scores(dist_inputs, explore, generator), mask)
        logp = _log_softmax_rows(dist_inputs).gather(-1, index.unsqueeze(-1)).squeeze(-1)
        return (index + self.start if self.start else index), logp, dist_inputs

    def entropy(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        return _categorical_entropy(dist_inputs)


class MultiCategoricalHead(_MaskedLogitsHead):
    """MultiDiscrete(nvec): one categorical per dimension over concatenated logits.

    Dimensions are padded to a common size so every dimension is sampled by a
    single argmax; padding entries are never chosen and carry zero probability.
    """

    def __init__(self, space: gym.spaces.MultiDiscrete) -> None:
        super().__init__()
        layout = multidiscrete_layout(space)
        self.num_model_outputs = action_feature_size(space)
        self.action_shape = tuple(space.shape)
        for name in ("gather_index", "valid", "start", "offsets"):
            # Buffers follow the module to its device; they are not weights.
            self.register_buffer(
                name, torch.from_numpy(getattr(layout, name).copy()), persistent=False
            )

    def _padded(self, concatenated: torch.Tensor) -> torch.Tensor:
        return concatenated[:, self.gather_index]

    def sample(
        self,
        dist_inputs: torch.Tensor,
        mask: torch.Tensor | None,
        explore: bool,
        generator: torch.Generator,
    ) -> torch.Tensor:
        allowed = self.valid if mask is None else self._padded(mask) & self.valid
        # Noise before padding: fewer draws when the dimensions differ in size.
        index = _argmax_allowed(self._padded(_scores(dist_inputs, explore, generator)), allowed)
        return (index + self.start).reshape(len(dist_inputs), *self.action_shape)

    def log_prob(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        columns = actions.long().reshape(len(actions), -1) - self.start + self.offsets
        normalisers = self._padded(dist_inputs).masked_fill(~self.valid, FLOAT_MIN).logsumexp(-1)
        return (dist_inputs.gather(-1, columns) - normalisers).sum(-1)

    def entropy(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        padded = self._padded(dist_inputs).masked_fill(~self.valid, FLOAT_MIN)
        return _categorical_entropy(padded).sum(-1)


class DiagGaussianHead(ActionHead):
    """Box: diagonal Gaussian with a state-independent, learned ``log_std``.

    The model outputs only the mean; ``log_std`` is one parameter per action
    dimension (initialised to 0, i.e. std 1), the usual choice for PPO-style
    training because it keeps exploration from collapsing per state.
    ``action_dist_inputs`` is ``[mean, log_std]`` concatenated. Not exploring
    returns the mean. Actions are raw (unclipped): the action connectors clip
    or unsquash them for the env.
    """

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        self.num_model_outputs = action_feature_size(space)
        self.action_shape = tuple(space.shape)
        self.log_std = nn.Parameter(torch.zeros(self.num_model_outputs))

    def distribution_inputs(
        self, model_out: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return torch.cat([model_out, self.log_std.expand_as(model_out)], dim=-1)

    def sample(
        self,
        dist_inputs: torch.Tensor,
        mask: torch.Tensor | None,
        explore: bool,
        generator: torch.Generator,
    ) -> torch.Tensor:
        mean, log_std = dist_inputs.chunk(2, dim=-1)
        if explore:
            noise = torch.randn(
                mean.shape, generator=generator, device=mean.device, dtype=mean.dtype
            )
            actions = mean + noise * log_std.exp()
        else:
            # A copy, so that actions never alias the stored distribution inputs.
            actions = mean.clone()
        return actions.reshape(len(dist_inputs), *self.action_shape)

    def log_prob(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = dist_inputs.chunk(2, dim=-1)
        z = (actions.reshape(mean.shape) - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, dist_inputs: torch.Tensor) -> torch.Tensor:
        _, log_std = dist_inputs.chunk(2, dim=-1)
        return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)


def make_action_head(space: gym.Space) -> ActionHead:
    """The head for ``space``; raises ValueError for spaces the policy cannot act in."""
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(space)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategoricalHead(space)
    if isinstance(space, gym.spaces.Box):
        return DiagGaussianHead(space)
    raise ValueError(
        f"TorchPolicy supports Discrete, MultiDiscrete and Box action spaces, got {space}"
    )
