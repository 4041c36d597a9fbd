"""The built-in MLP's forward pass in numpy, for a CPU policy's per-round call.

At sampling sizes (a few hundred rows, 64-unit layers) a torch module call
spends most of its time dispatching: ~300 us for the default two-trunk MLP
at 256 rows, against ~100 us for the same matmuls, additions and
activations in numpy. So on CPU a policy whose model is exactly the built-in
``MLPModel`` runs its sampling forward pass here; training (``evaluate``,
with gradients) stays in torch.

The weights are views of the torch parameters (same memory), so in-place
changes (an optimiser's step, ``load_state_dict``, ``set_weights``) show at
once. Every call first checks, for ~8 us, that the model is still what the
views were taken of: the same modules and parameters, in the same memory
with the same strides, no forward hooks, no ``forward`` replaced on an
instance or patched on a class. If not, the views are taken again, or,
where numpy cannot stand in for torch (weights not float32 on CPU, a layer
it does not know, a head without bias, hooks), the caller runs the torch
module as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules import module as torch_module

from marl_runner.policy.models import MLPModel

__all__ = ["NumpyMLP"]

_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x, out: np.maximum(x, 0, out=out)}
# The classes whose forward numpy stands in for, with that forward: a class patched since
# (a monkeypatch) leaves the model to torch.
_FORWARDS = tuple((cls, cls.forward) for cls in (MLPModel, nn.Sequential, nn.Linear, *_ACTIVATIONS))


class NumpyMLP:
    """``MLPModel.forward`` on float32 numpy rows: ``(logits [n, k], values [n])``."""

    def __init__(self, model: MLPModel) -> None:
        self._model = model
        self._signature: tuple = ()
        # Per trunk: (weight view, bias column view, activation or None) per linear layer.
        self._policy: list[tuple] | None = None
        self._value: list[tuple] | None = None
        self._heads: tuple = ()

    @classmethod
    def for_model(cls, model: nn.Module) -> NumpyMLP | None:
        """The numpy forward of ``model``; None unless it is exactly a built-in ``MLPModel``
        (a subclass may change ``forward``)."""
        return cls(model) if type(model) is MLPModel else None

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The model's outputs for ``rows`` ``[n, input_dim]``; None where torch must run it."""
        signature = _signature(self._model)
        if signature != self._signature:
            self._signature = signature
            self._bind()
        if self._policy is None or rows.dtype != np.float32:
            return None
        # Column-wise (see _run): the rows transposed in, the logits transposed out.
        columns = np.ascontiguousarray(rows.T)
        # Silent on inf/NaN rows as torch is (and on the invalid-operation flag OpenBLAS
        # can leave set on finite inputs, numpy issue 24067).
        with np.errstate(invalid="ignore", over="ignore"):
            features = _run(self._policy, columns)
            value_features = features if self._value is None else _run(self._value, columns)
            (logits_weight, logits_bias), (value_weight, value_bias) = self._heads
            logits = logits_weight @ features
            logits += logits_bias
            values = value_weight @ value_features
            values += value_bias
        return np.ascontiguousarray(logits.T), values.reshape(-1)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled unbound: views would travel as copies, and the data pointers they were
        checked by mean nothing in another process; the first call there binds again."""
        return {**self.__dict__, "_signature": (), "_policy": None, "_value": None, "_heads": ()}

    def _bind(self) -> None:
        """Takes views of the model's weights; ``_policy`` None where numpy cannot run it."""
        self._policy = None
        model = self._model
        _, _, hooked = self._signature
        if hooked or not all(
            p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters()
        ):
            return
        try:
            policy = _trunk(model.policy_trunk)
            value = None if model.value_trunk is None else _trunk(model.value_trunk)
            heads = (_linear(model.logits), _linear(model.value))
        except _UnknownLayer:
            return
        self._policy, self._value, self._heads = policy, value, heads


class _UnknownLayer(Exception):
    """A trunk holds a module numpy does not run (the torch forward is used instead)."""


def _signature(model: MLPModel) -> tuple[list[Any], list[tuple], bool]:
    """What the views depend on: the modules (the model, its children and theirs), their
    parameters and where those live (memory and strides), and whether anything (a hook, an
    instance or class ``forward``) changes what calling the model does. Read through the
    modules' own dicts: ``nn.Module``'s attribute lookup would cost more than the rest."""
    modules: list[Any] = [model]
    for child in model._modules.values():
        modules.append(child)
        if child is not None:
            modules.extend(child._modules.values())
    modules = [m for m in modules if m is not None]
    # By id (a tensor's == is elementwise); the model holds them, so no id is reused.
    places = [
        (id(p), p.data_ptr(), p.stride())
        for m in modules
        for p in m._parameters.values()
        if p is not None
    ]
    hooked = bool(
        getattr(torch_module, "_global_forward_hooks", None)
        or getattr(torch_module, "_global_forward_pre_hooks", None)
        or any(cls.forward is not forward for cls, forward in _FORWARDS)
        or any(
            m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__
            or "_call_impl" in m.__dict__
            for m in modules
        )
    )
    return modules, places, hooked


def _linear(layer: nn.Module) -> tuple[np.ndarray, np.ndarray]:
    """Views of the layer's weight ``[out, in]`` (torch's layout) and bias as a column."""
    if type(layer) is not nn.Linear or layer.bias is None:
        raise _UnknownLayer(layer)
    return layer.weight.detach().numpy(), layer.bias.detach().numpy()[:, None]


def _trunk(trunk: nn.Module) -> list[tuple]:
    """``Linear`` layers, each followed by at most one known activation, in exactly an
    ``nn.Sequential`` (a subclass may have its own ``forward``)."""
    if type(trunk) is not nn.Sequential:
        raise _UnknownLayer(trunk)
    steps: list[tuple] = []
    for module in trunk:
        activation = _ACTIVATIONS.get(type(module))
        if activation is not None and steps and steps[-1][2] is None:
            steps[-1] = (*steps[-1][:2], activation)
        else:
            steps.append((*_linear(module), None))
    return steps


def _run(steps: list[tuple], columns: np.ndarray) -> np.ndarray:
    """The trunk over ``columns`` (the rows transposed, ``[in, n]``), giving ``[out, n]``;
    each activation in place on its layer's fresh output.

    ``weight @ columns`` with both C-contiguous: for a few dozen rows OpenBLAS
    multiplies such operands up to ~2x faster than ``rows @ weight.T`` (a transposed
    operand; the whole pass ~10-20 % faster, about even from ~500 rows), and torch
    keeps a linear layer's weight as ``[out, in]``, so no copy of it is needed.
    """
    out = columns
    for weight, bias, activation in steps:
        out = weight @ out
        out += bias
        if activation is not None:
            activation(out, out=out)
    return out
