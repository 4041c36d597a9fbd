"""Torch plumbing for policies: device choice, seeded init, one-copy host transfer."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

__all__ = [
    "limit_inference_threads", "packed_to_numpy", "resolve_device", "restore_generator",
    "seeded_cpu_rng",
]


def limit_inference_threads(num_threads: int) -> None:
    """Torch's intra-op threads and numpy's BLAS threads, process-wide.

    Both, because CPU inference runs in either (``numpy_mlp``); an unlimited
    BLAS would run a few hundred rows' matmuls on every core, fighting the
    env workers for them.
    """
    torch.set_num_threads(num_threads)
    threadpool_limits(num_threads, user_api="blas")


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


def restore_generator(generator: torch.Generator, state: Any) -> None:
    """Sets a torch generator to a saved ``sampler_rng_state``.

    A state of another kind of generator (a numpy sampler's ``uint64`` words, a
    CPU generator's bytes on a CUDA one or the reverse, as when a checkpoint
    moves between devices) cannot be continued: it seeds the generator
    instead, so the same saved state always gives the same draws.
    """
    array = np.ascontiguousarray(np.asarray(state))
    if array.dtype == np.uint8 and array.shape == tuple(generator.get_state().shape):
        generator.set_state(torch.from_numpy(array))
        return
    if array.dtype.kind not in "biu" or array.ndim != 1 or not array.size:
        raise ValueError(
            f"sampler_rng_state has dtype {array.dtype} and shape {array.shape}; expected a "
            "1-D integer array (a saved generator state)"
        )
    digest = hashlib.blake2b(array.tobytes(), digest_size=8).digest()
    generator.manual_seed(int.from_bytes(digest, "little") >> 1)
