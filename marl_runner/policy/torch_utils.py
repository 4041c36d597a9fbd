"""Torch plumbing for policies: device choice, seeded init, one-copy host transfer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["packed_to_numpy", "resolve_device", "seeded_cpu_rng"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``cpu | cuda[:i] | auto`` -> torch.device; ``auto`` picks CUDA when available."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"unknown policy device {device!r}; expected 'cpu', 'cuda' or 'auto'"
        ) from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"policy device {device!r} requested but CUDA is not available; use 'cpu' or 'auto'"
        )
    return resolved


def packed_to_numpy(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Same-length tensors on an accelerator -> numpy, with one device-to-host copy.

    Everything is packed into one float32 block first (integer actions are exact
    in float32 below 2**24), so a round pays for a single transfer and
    synchronisation. On CPU, call ``.numpy()`` instead: that shares memory.
    """
    num_rows = len(tensors[0])
    widths = [int(np.prod(t.shape[1:])) for t in tensors]
    packed = torch.cat([t.reshape(num_rows, w).float() for t, w in zip(tensors, widths)], dim=1)
    block = packed.cpu().numpy()
    parts = np.split(block, np.cumsum(widths)[:-1], axis=1)
    return [
        part.reshape(t.shape).astype(np.float32 if t.is_floating_point() else np.int64, copy=False)
        for part, t in zip(parts, tensors)
    ]


@contextlib.contextmanager
def seeded_cpu_rng(seed: int | None) -> Iterator[None]:
    """Seeds weight init without disturbing the caller's global torch RNG."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))
        yield
