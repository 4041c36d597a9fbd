"""Built-in torch models and the factory that reads a policy's ``model`` config.

Model protocol (built-in and user classes alike): the constructor takes
``(obs_dim, num_outputs, **kwargs)`` (the ``cnn`` model takes the image
shape ``(H, W, C)`` instead of ``obs_dim``, and its input unflattened). A feed-forward model's
``forward(obs)`` returns ``(dist_inputs, value)``; a recurrent model also
defines ``get_initial_state() -> list[Tensor]`` (one tensor per state, shape
of one row), and its ``forward(obs, state)`` returns
``(dist_inputs, value, state_out)``, one step per row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from connectors.imports import import_object

__all__ = ["MODEL_KEYS", "CNNModel", "LSTMModel", "MLPModel", "build_model", "is_recurrent_model"]

#: Keys of the built-in model types (``model: {type: ...}``), with their reference text.
MODEL_KEYS = {
    "mlp": {
        "type": "mlp: separate policy and value MLPs over the flat observation.",
        "hidden": "Layer sizes. Default: [64, 64].",
        "activation": "tanh or relu. Default: tanh.",
        "vf_share_layers": "One trunk for policy and value. Default: false.",
    },
    "lstm": {
        "type": "lstm: an MLP encoder, one LSTM step per row, policy and value heads.",
        "hidden": "Encoder layer sizes. Default: [64].",
        "activation": "tanh or relu. Default: tanh.",
        "lstm_cell_size": "LSTM state size. Default: 64.",
    },
    "cnn": {
        "type": "cnn: convolutions over image observations (height, width, channels), "
        "channels last; uint8 pixels are scaled to [0, 1] inside the model.",
        "conv": "Conv layers as [out_channels, kernel, stride], no padding. "
        "Default: [[32, 8, 4], [64, 4, 2], [64, 3, 1]] (Nature CNN, for 84x84).",
        "hidden": "Dense layer sizes after the convolutions. Default: [512].",
        "activation": "tanh or relu. Default: relu.",
        "vf_share_layers": "One conv and dense trunk for policy and value (half the compute; "
        "with large unclipped rewards the value loss can swamp the policy). Default: false.",
    },
}
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
_CHOICES = "'mlp', 'lstm', 'cnn' or {class: 'pkg.mod:Cls', ...}"
#: Nature CNN (Mnih et al. 2015): [out_channels, kernel, stride] per layer, for 84x84 input.
NATURE_CONV = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def _linear(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    """Orthogonal init with a per-layer gain: the usual PPO initialisation.

    A small gain on the logits layer makes the initial policy near uniform.
    """
    layer = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(in_dim: int, hidden: Sequence[int], activation: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for size in hidden:
        layers += [_linear(in_dim, int(size), math.sqrt(2.0)), _ACTIVATIONS[activation]()]
        in_dim = int(size)
    return nn.Sequential(*layers), in_dim


class MLPModel(nn.Module):
    """Policy and value MLPs over a flat input (separate trunks unless ``vf_share_layers``)."""

    def __init__(
        self,
        obs_dim: int,
        num_outputs: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        vf_share_layers: bool = False,
    ) -> None:
        super().__init__()
        self.policy_trunk, width = _mlp(obs_dim, hidden, activation)
        self.value_trunk = None if vf_share_layers else _mlp(obs_dim, hidden, activation)[0]
        self.logits = _linear(width, num_outputs, 0.01)
        self.value = _linear(width, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.policy_trunk(obs)
        value_features = features if self.value_trunk is None else self.value_trunk(obs)
        return self.logits(features), self.value(value_features).squeeze(-1)


class LSTMModel(nn.Module):
    """MLP encoder, then one LSTM step per row, then policy and value heads.

    Uses ``nn.LSTM`` (not ``LSTMCell``) so a trainer can run the same weights
    over whole sequences; sampling feeds sequences of length 1.
    """

    def __init__(
        self,
        obs_dim: int,
        num_outputs: int,
        hidden: Sequence[int] = (64,),
        activation: str = "tanh",
        lstm_cell_size: int = 64,
    ) -> None:
        super().__init__()
        self.encoder, width = _mlp(obs_dim, hidden, activation)
        self.cell_size = int(lstm_cell_size)
        self.lstm = nn.LSTM(width, self.cell_size, batch_first=True)
        self.logits = _linear(self.cell_size, num_outputs, 0.01)
        self.value = _linear(self.cell_size, 1, 1.0)

    def get_initial_state(self) -> list[torch.Tensor]:
        """Zero `(h, c)`, one row each: defining it is what marks a model as recurrent."""
        return [torch.zeros(self.cell_size), torch.zeros(self.cell_size)]

    def forward(
        self, obs: torch.Tensor, state: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        h, c = state
        out, (h_out, c_out) = self.lstm(
            self.encoder(obs).unsqueeze(1),
            (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()),
        )
        out = out.squeeze(1)
        return self.logits(out), self.value(out).squeeze(-1), [h_out[0], c_out[0]]


class CNNModel(nn.Module):
    """Convolutions, then dense layers, then policy and value heads, over images.

    Input: ``[n, H, W, C]`` channels last, as the connectors hand images out
    (frames stacked on C); uint8 pixels are scaled to [0, 1] here, so batches
    keep them 4x smaller than float32. Other dtypes are used as they are.
    Convolutions have no padding; a stack that shrinks the image to nothing
    is an error when the model is built, naming the layer.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_outputs: int,
        conv: Sequence[Sequence[int]] = NATURE_CONV,
        hidden: Sequence[int] = (512,),
        activation: str = "relu",
        vf_share_layers: bool = False,
    ) -> None:
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(
                f"the cnn model takes images of shape (height, width, channels), got {tuple(obs_shape)}"
            )
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.policy_trunk, width = self._trunk(conv, hidden, activation)
        self.value_trunk = None if vf_share_layers else self._trunk(conv, hidden, activation)[0]
        self.logits = _linear(width, num_outputs, 0.01)
        self.value = _linear(width, 1, 1.0)

    def _trunk(
        self, conv: Sequence[Sequence[int]], hidden: Sequence[int], activation: str
    ) -> tuple[nn.Sequential, int]:
        height, width, channels = self.obs_shape
        layers: list[nn.Module] = []
        for index, (out_channels, kernel, stride) in enumerate(conv):
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            if height < 1 or width < 1:
                raise ValueError(
                    f"cnn conv layer {index} {list(conv[index])} (kernel {kernel}, stride {stride}) "
                    f"leaves nothing of a {self.obs_shape[0]}x{self.obs_shape[1]} image; use "
                    "fewer or smaller layers, or resize the images less"
                )
            layer = nn.Conv2d(channels, int(out_channels), int(kernel), int(stride))
            nn.init.orthogonal_(layer.weight, math.sqrt(2.0))
            nn.init.zeros_(layer.bias)
            layers += [layer, _ACTIVATIONS[activation]()]
            channels = int(out_channels)
        dense, features = _mlp(channels * height * width, hidden, activation)
        return nn.Sequential(*layers, nn.Flatten(), dense), features

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        images = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
        images = images.permute(0, 3, 1, 2)  # NHWC -> NCHW, as Conv2d wants
        features = self.policy_trunk(images)
        value_features = features if self.value_trunk is None else self.value_trunk(images)
        return self.logits(features), self.value(value_features).squeeze(-1)


def is_recurrent_model(model: nn.Module) -> bool:
    """Recurrent models declare their state by defining ``get_initial_state``."""
    return callable(getattr(model, "get_initial_state", None))


def _check_builtin(model_type: str, config: Mapping[str, Any]) -> None:
    unknown = sorted(set(config) - set(MODEL_KEYS[model_type]))
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in {model_type} model config; "
            f"expected some of {sorted(MODEL_KEYS[model_type])}"
        )
    activation = config.get("activation", "tanh")
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"unknown model activation {activation!r}; expected one of {sorted(_ACTIVATIONS)}"
        )
    conv = config.get("conv", NATURE_CONV)
    if not (
        isinstance(conv, Sequence)
        and len(conv) > 0
        and all(_is_conv_layer(layer) for layer in conv)
    ):
        raise ValueError(
            f"cnn model conv must be a non-empty list of [out_channels, kernel, stride] "
            f"integer triples >= 1, got {conv!r}"
        )


def _is_conv_layer(layer: Any) -> bool:
    if not (isinstance(layer, Sequence) and len(layer) == 3):
        return False
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in layer)


#: The most parameters a built-in model may have with the env's sizes (the observation
#: after the agent connectors, the actions): 250M float32 is 1 GB. Counted on torch's meta
#: device before the model is built (``check_model_weights``); the config reference
#: (``config.schema``) gives the same number.
MAX_BUILT_MODEL_PARAMETERS = 250_000_000


def check_model_weights(
    config: Mapping[str, Any],
    obs_dim: int,
    num_outputs: int,
    obs_shape: Sequence[int] | None = None,
) -> None:
    """Refuses a built-in model of more than ``MAX_BUILT_MODEL_PARAMETERS`` weights with
    these sizes, counted on torch's ``meta`` device (nothing allocated) before it is built:
    the config's own sizes are bounded, but the observation the agent connectors make
    (an image resized large, frames stacked) multiplies the first layer.

    Raises:
        ValueError: the count, the observation's size and the limit.
    """
    if "class" in config:
        return  # a custom model class is the user's own
    with torch.device("meta"):
        model = build_model(config, obs_dim, num_outputs, obs_shape)
    count = sum(parameter.numel() for parameter in model.parameters())
    if count > MAX_BUILT_MODEL_PARAMETERS:
        shape = f"shape {tuple(obs_shape)}" if obs_shape is not None else f"{obs_dim:,} values"
        raise ValueError(
            f"the {config.get('type', 'mlp')} model would have {count:,} weights for "
            f"observations of {shape}, more than the {MAX_BUILT_MODEL_PARAMETERS:,} a built-in "
            "model may have; make the observations smaller (the agent connectors' sizes) or "
            "the layers narrower"
        )


def build_model(
    config: Mapping[str, Any],
    obs_dim: int,
    num_outputs: int,
    obs_shape: Sequence[int] | None = None,
) -> nn.Module:
    """The model described by ``config``: ``{type: mlp|lstm|cnn, ...}`` or ``{class: ..., **kwargs}``.

    ``obs_shape`` is the unflattened observation shape; the ``cnn`` model
    needs it (an image, ``(H, W, C)``), the others take ``obs_dim``.

    Raises:
        ValueError: unknown model type, unknown keys of a built-in model, an
            unknown activation, a malformed ``conv``, or ``cnn`` without an
            image shape; the message lists the choices.
    """
    config = dict(config)
    if "class" in config:
        if "type" in config:
            raise ValueError(
                f"model config sets both 'type' ({config['type']!r}) and 'class' "
                f"({config['class']!r}); expected one of {_CHOICES}"
            )
        model_cls = config.pop("class")
        if isinstance(model_cls, str):
            model_cls = import_object(model_cls)
        return model_cls(obs_dim, num_outputs, **config)
    model_type = config.setdefault("type", "mlp")
    if not isinstance(model_type, str) or model_type not in MODEL_KEYS:
        raise ValueError(f"unknown model type {model_type!r}; expected {_CHOICES}")
    _check_builtin(model_type, config)
    del config["type"]
    if model_type == "cnn":
        if obs_shape is None or len(obs_shape) != 3:
            raise ValueError(
                "model type 'cnn' needs image observations of shape (height, width, channels), "
                f"got shape {None if obs_shape is None else tuple(obs_shape)}"
            )
        return CNNModel(obs_shape, num_outputs, **config)
    model_cls = MLPModel if model_type == "mlp" else LSTMModel
    return model_cls(obs_dim, num_outputs, **config)
