"""What a persistent DataLoader worker needs at the start of each iteration.

A worker holds its own copy of the dataset, made when it started; with ``persistent_workers``
it starts once, so what the training process decides per iteration (the epoch, the batches a
resumed epoch already delivered, the workers' seed) would never reach it. The training process
writes those into a few integers in shared memory before the iteration begins (torch then sends
each worker its resume message, so the write happens before the read), and each worker reads
them when its ``__iter__`` runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

__all__ = ["IterationPlan", "WorkerPlan", "reseed_worker", "torch_base_seed"]

_FIELDS = 5


@dataclass(frozen=True)
class IterationPlan:
    """One iteration of a tracked loader, as its workers must see it."""

    epoch: int
    batches_consumed: int
    batch_size: int | None
    drop_last: bool
    base_seed: int


class WorkerPlan:
    """The shared integers; made in the training process before the workers start."""

    def __init__(self) -> None:
        self._values = torch.zeros(_FIELDS, dtype=torch.int64).share_memory_()

    def write(self, plan: IterationPlan) -> None:
        batch_size = -1 if plan.batch_size is None else plan.batch_size
        fields = [plan.epoch, plan.batches_consumed, batch_size, int(plan.drop_last)]
        self._values.copy_(torch.tensor([*fields, plan.base_seed], dtype=torch.int64))

    def read(self) -> IterationPlan:
        epoch, consumed, batch_size, drop_last, base_seed = self._values.tolist()
        return IterationPlan(
            epoch=epoch,
            batches_consumed=consumed,
            batch_size=None if batch_size < 0 else batch_size,
            drop_last=bool(drop_last),
            base_seed=base_seed,
        )


def torch_base_seed(generator: torch.Generator) -> int:
    """The base seed torch's iterator will draw from ``generator`` for its workers (drawn
    from a copy, so the generator itself is left for torch)."""
    copy = torch.Generator()
    copy.set_state(generator.get_state())
    return int(torch.empty((), dtype=torch.int64).random_(generator=copy).item())


def reseed_worker(base_seed: int, worker_id: int) -> None:
    """Seed this worker as torch seeds a newly started one (``random``, torch, NumPy), so a
    persistent worker's later epochs draw what a fresh worker's would."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    from torch.utils.data._utils.worker import _generate_state

    np.random.seed(_generate_state(base_seed, worker_id))
