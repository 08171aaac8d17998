"""Pure functions that decide which files a rank and a DataLoader worker read, and where a
resumed epoch starts.

Rule: the epoch's file order (sorted, or a seeded permutation) is dealt round-robin to ranks
(``order[rank::world_size]``) and each rank's share round-robin to its DataLoader workers
(``share[worker::num_workers]``), i.e. a stride of ``world_size * num_workers`` over the epoch.

Resume relies on how ``torch.utils.data.DataLoader`` (``in_order=True``, the default) delivers
batches of an ``IterableDataset``: worker 0, 1, ..., W-1, 0, 1, ... skipping workers that ran out.
That order is a pure function of the per-worker batch counts, so "batches consumed" maps back to
per-worker offsets exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "Balance",
    "ResumePlan",
    "batches_for",
    "block_share",
    "delivery_order",
    "epoch_order",
    "epoch_seed",
    "rank_block",
    "rank_share",
    "resume_plan",
    "worker_share",
]

Balance = Literal["pad", "drop", "none"]


def epoch_order(num_files: int, *, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Indices of the files in the order of ``epoch``; identical on every rank and worker."""
    if not shuffle:
        return list(range(num_files))
    generator = torch.Generator()
    generator.manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(num_files, generator=generator).tolist()


def epoch_seed(seed: int, epoch: int) -> int:
    """One 63-bit seed from ``(seed, epoch)``; distinct pairs do not collide."""
    return ((seed & 0x7FFFFFFF) << 31 | (epoch & 0x7FFFFFFF)) & (2**63 - 1)


def rank_share(order: list[int], *, rank: int, world_size: int, balance: Balance) -> list[int]:
    """The part of the epoch order that ``rank`` reads.

    ``balance`` decides what happens when the file count is not a multiple of ``world_size``:
    ``"pad"`` repeats files from the start of the order so every rank gets the same count (like
    ``DistributedSampler``), ``"drop"`` leaves out the tail of the order, ``"none"`` keeps every
    file exactly once and lets ranks differ by one item.
    """
    return _balanced(order, rank=rank, world_size=world_size, balance=balance)[rank::world_size]


def rank_block(order: list[int], *, rank: int, world_size: int, balance: Balance) -> list[int]:
    """Like :func:`rank_share`, but the rank's part is a contiguous block of the order (the
    rule for tar shards, whose samples are read shard by shard)."""
    order = _balanced(order, rank=rank, world_size=world_size, balance=balance)
    return block_share(order, part=rank, parts=world_size)


def _balanced(order: list[int], *, rank: int, world_size: int, balance: Balance) -> list[int]:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    remainder = len(order) % world_size
    if remainder and balance == "pad":
        target = len(order) + world_size - remainder
        order = (order * (target // len(order) + 1))[:target]
    elif remainder and balance == "drop":
        order = order[: len(order) - remainder]
    return order


def block_share(items: list[int], *, part: int, parts: int) -> list[int]:
    """Contiguous part ``part`` of ``parts`` of ``items``; parts differ in length by one at most,
    the longer ones first (``none``'s rule too: a rank or worker with more items comes first)."""
    size, extra = divmod(len(items), parts)
    start = part * size + min(part, extra)
    return items[start : start + size + (1 if part < extra else 0)]


def worker_share(items: list[int], *, worker: int, num_workers: int) -> list[int]:
    """The part of a rank's share that DataLoader worker ``worker`` reads."""
    return items[worker::num_workers]


def batches_for(num_items: int, batch_size: int | None, drop_last: bool) -> int:
    """Number of batches a DataLoader worker makes from ``num_items`` items."""
    if batch_size is None:
        return num_items
    return num_items // batch_size if drop_last else math.ceil(num_items / batch_size)


def delivery_order(batch_counts: list[int]) -> list[int]:
    """Worker id of every batch, in the order the DataLoader hands batches to the loop."""
    order: list[int] = []
    for round_ in range(max(batch_counts, default=0)):
        order.extend(w for w, count in enumerate(batch_counts) if round_ < count)
    return order


@dataclass(frozen=True)
class ResumePlan:
    """Where each worker's stream restarts after ``batches_consumed`` batches of an epoch.

    ``skip[w]`` items of original worker ``w`` are already consumed. The resumed DataLoader
    starts its round-robin at worker 0, so resumed worker ``j`` reads the stream of original
    worker ``(first + j) % num_workers``; that keeps the batch order identical to an
    uninterrupted epoch, not just the set of files.
    """

    skip: tuple[int, ...]
    first: int


def resume_plan(
    items_per_worker: list[int], *, batch_size: int | None, drop_last: bool, batches_consumed: int
) -> ResumePlan:
    """Map a count of delivered batches back to per-worker offsets (see :class:`ResumePlan`)."""
    counts = [batches_for(n, batch_size, drop_last) for n in items_per_worker]
    order = delivery_order(counts)
    if not 0 <= batches_consumed <= len(order):
        raise ValueError(
            f"{batches_consumed} batches consumed, but this epoch has only {len(order)} batches"
        )
    consumed = [0] * len(items_per_worker)
    for worker in order[:batches_consumed]:
        consumed[worker] += 1
    per_batch = 1 if batch_size is None else batch_size
    skip = tuple(min(c * per_batch, n) for c, n in zip(consumed, items_per_worker, strict=True))
    first = order[batches_consumed] if batches_consumed < len(order) else 0
    return ResumePlan(skip=skip, first=first)
