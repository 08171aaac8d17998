"""Small tensors go from a DataLoader worker to its rank by value, not through shared memory.

torch's ``DataLoader`` moves every tensor of a batch through shared memory: the worker copies
it into a new shared-memory file and hands the rank that file's descriptor, over a connection
of its own. That is the right way for a batch of images; for a batch of 32 labels or token
counts it is almost all of the batch's cost: on 2 cores, batches of 4 KiB went 5x as fast
pickled by value, and by value stays ahead up to about 256 KiB (``docs/data.md``). Our loaders'
workers pickle a plain CPU tensor of at most :data:`INLINE_MAX_BYTES` by value; larger ones,
and any with autograd, a quantized or sparse layout, take torch's shared memory as before.

By value, a tensor arrives as a new contiguous tensor: two tensors of one batch that were views
of one storage in the worker arrive as two storages.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

__all__ = ["INLINE_MAX_BYTES", "InlineSmallTensors"]

INLINE_MAX_BYTES = 128 << 10


def _rebuild(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def _by_value(tensor: torch.Tensor) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.requires_grad
        and not tensor.is_quantized
        and tensor.numel() * tensor.element_size() <= INLINE_MAX_BYTES
    )


def _reduce(tensor: torch.Tensor) -> tuple[Any, ...]:
    if not _by_value(tensor):
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(tensor)
    flat = tensor.resolve_conj().resolve_neg().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return _rebuild, (raw, tensor.dtype, tuple(tensor.shape))


class InlineSmallTensors:
    """A ``worker_init_fn`` that makes the worker's batches carry small tensors by value,
    then runs the user's own ``worker_init_fn``."""

    def __init__(self, user_init: Callable[[int], None] | None) -> None:
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        # The worker's queue pickles with ForkingPickler, where torch registered its own
        # reduction for torch.Tensor; this one replaces it in this worker process only.
        ForkingPickler.register(torch.Tensor, _reduce)
        if self.user_init is not None:
            self.user_init(worker_id)
