"""The config's model checked against a checkpoint's weights, before any model is built.

A checkpoint's config says which model to build and its weights what fills
it. Building first and comparing after (``load_state_dict``) lets a file whose
config asks for ``hidden: [20000, 20000]`` allocate gigabytes before the
mismatch is found. Here the built-in model types are built on torch's
``meta`` device, which records shapes and allocates nothing, twice with
different input and output sizes: the sizes that do not change between the
two come from the config alone, and the file's arrays must have them. The
input and output sizes come from the env, so they are left to the restore.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from marl_runner.checkpoint.file_format import CheckpointError
from marl_runner.config import RunnerConfig

__all__ = ["check_model_shapes"]

#: Policy classes whose weights are ``model.*`` of a ``build_model`` model.
_MODEL_POLICIES = (None, "TorchPolicy")
_PREFIX = "model."


def check_model_shapes(
    policies: Mapping[str, Any], config: RunnerConfig, path: str | os.PathLike[str]
) -> None:
    """Raises ``CheckpointError`` when a policy's weights cannot fit the model its config asks
    for (a built-in type: mlp, lstm, cnn); custom model classes are the caller's, unchecked."""
    for pid, state in policies.items():
        spec = config.policies.get(pid)
        if spec is None or spec["policy_class"] not in _MODEL_POLICIES:
            continue  # a policy the runner lacks is reported when the state is applied
        model = spec["model"]
        if "class" in model:
            continue
        expected = _config_shapes(model)
        if expected is None:
            continue  # a model config the policy itself will refuse, with its own message
        weights = state["weights"]
        where = f"checkpoint field policies.{pid}.weights"
        if not isinstance(weights, Mapping):
            raise CheckpointError(
                f"{path}: {where} is a {type(weights).__name__}; expected an object"
            )
        held = {k: v for k, v in weights.items() if isinstance(k, str) and k.startswith(_PREFIX)}
        wanted = f"the config's model for policy {pid!r} ({_short(model)})"
        for name, shape in expected.items():
            array = held.get(name)
            if array is None:
                raise CheckpointError(
                    f"{path}: {where} has no {name!r}, which {wanted} has; the weights do not "
                    "fit the model, so nothing was built"
                )
            if not _fits(array, shape):
                got = list(array.shape) if isinstance(array, np.ndarray) else _short(array)
                raise CheckpointError(
                    f"{path}: {wanted} has {name} of shape {_shape_text(shape)}, but "
                    f"{where}.{name} is {got}; the weights do not fit the model, so nothing "
                    "was built"
                )
        extra = sorted(set(held) - set(expected))
        if extra:
            raise CheckpointError(
                f"{path}: {where} holds {_short(extra)}, which {wanted} does not have"
            )


def _config_shapes(model: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]] | None:
    """``{"model.<name>": shape}`` of the model, ``None`` for a size set by the env."""
    import torch  # only when a checkpoint names a torch model

    from marl_runner.policy.models import build_model

    conv_side, strides = _conv_side(model)
    probes = []
    try:
        with torch.device("meta"):
            for obs_dim, outputs, side, channels in (
                (3, 2, conv_side, 1),
                (5, 7, conv_side + strides, 3),
            ):
                built = build_model(model, obs_dim, outputs, obs_shape=(side, side, channels))
                probes.append({k: tuple(v.shape) for k, v in built.state_dict().items()})
    except (ValueError, TypeError, KeyError):
        return None
    first, second = probes
    if first.keys() != second.keys():
        return None
    return {
        _PREFIX + name: tuple(a if a == b else None for a, b in zip(shape, second[name]))
        for name, shape in first.items()
        if len(shape) == len(second[name])
    }


def _conv_side(model: Mapping[str, Any]) -> tuple[int, int]:
    """The least image side a cnn's conv layers accept, and the product of their strides
    (so that a larger probe changes every size that depends on the image)."""
    layers = model.get("conv") if model.get("type") == "cnn" else None
    if not isinstance(layers, list) or not layers:
        from marl_runner.policy.models import NATURE_CONV

        layers = NATURE_CONV
    side, strides = 1, 1
    try:
        for _, kernel, stride in reversed(layers):
            side = (side - 1) * int(stride) + int(kernel)
            strides *= int(stride)
    except (TypeError, ValueError):
        return 1, 1
    return side, strides


def _fits(array: Any, shape: tuple[int | None, ...]) -> bool:
    return (
        isinstance(array, np.ndarray)
        and array.ndim == len(shape)
        and all(want is None or want == got for want, got in zip(shape, array.shape))
    )


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if n is None else str(n) for n in shape) + "]"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = 6


def _short(value: Any) -> str:
    return _REPR.repr(value)
