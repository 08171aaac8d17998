"""Which rank of how many this process is."""

from __future__ import annotations

import os

import torch.distributed as dist

__all__ = ["resolve_topology"]


def resolve_topology(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: explicit values, else ``torch.distributed`` when initialised,
    else the ``RANK`` / ``WORLD_SIZE`` environment variables, else ``(0, 1)``."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
