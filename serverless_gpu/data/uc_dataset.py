"""``UCVolumeDataset``: the original API's dataset, every file once per epoch and
checkpointable per DataLoader worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, TypeVar

from torch.utils.data import get_worker_info

from serverless_gpu.data.dataset import VolumeDataset
from serverless_gpu.data.errors import PositionUnknownError
from serverless_gpu.data.position import Position
from serverless_gpu.data.sharding import Balance
from serverless_gpu.data.topology import resolve_topology

__all__ = ["UCVolumeDataset"]

T = TypeVar("T")


class UCVolumeDataset(VolumeDataset[T]):
    """The original API's dataset: a :class:`VolumeDataset` that gives every file exactly
    once per epoch (``balance="none"``: ranks may differ by one file) and is
    :class:`~serverless_gpu.data.Checkpointable` per DataLoader worker, for
    :class:`~serverless_gpu.data.DataLoader`.

    Rank ``r`` of ``W`` with ``K`` workers reads ``files[worker * W + r :: W * K]`` of the epoch
    order. Under ``DataLoader``, ``state_dict()`` is the calling worker's progress (files it
    yielded this epoch) and ``load_state_dict`` makes its next iteration skip them; through
    :class:`~serverless_gpu.data.VolumeDataLoader` both are :class:`VolumeDataset`'s.
    Under ``DataLoader`` each copy moves to the next epoch when it has read its share, so
    ``shuffle=True`` gives a new order every epoch with persistent workers too.
    Arguments are :class:`VolumeDataset`'s.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        balance: Balance = "none",
        **kwargs: Any,
    ) -> None:
        super().__init__(path, cache_dir, balance=balance, **kwargs)
        self._yielded = 0
        self._skip = 0

    def state_dict(self) -> dict[str, Any]:
        if self._tracked:
            return super().state_dict()
        return {
            "stream": 1,
            "epoch": self.epoch,
            "rank": self._topology[0],
            "worker": _worker_id(),
            "yielded": self._yielded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "stream" not in state:
            super().load_state_dict(state)
            return
        here = (self._topology[0], _worker_id())
        if (state["rank"], state["worker"]) != here:
            raise PositionUnknownError(
                f"this state is of rank {state['rank']}'s worker {state['worker']}, and is "
                f"being loaded into rank {here[0]}'s worker {here[1]}"
            )
        self._position = Position(epoch=state["epoch"])
        self._skip = state["yielded"]

    def __iter__(self) -> Iterator[T]:
        if self._tracked:
            return super().__iter__()
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if info is None:
            self._topology = resolve_topology(*self._explicit_topology)
        mine = self._worker_part(self._rank_share(), worker, workers)
        skip, self._skip = self._skip, 0  # a resume applies to one iteration
        return self._counted(self._read(mine[skip:]), skip)

    def _counted(self, items: Iterator[T], skip: int) -> Iterator[T]:
        self._yielded = skip
        for item in items:
            self._yielded += 1  # before the yield: the batch's collate sees the item counted
            yield item
        # A copy that read its whole share goes on to the next epoch (and its shuffle order):
        # a persistent worker's copy never sees set_epoch calls made in the training process.
        self._position = Position(epoch=self.epoch + 1)
        self._yielded = 0


def _worker_id() -> int:
    info = get_worker_info()
    return 0 if info is None else info.id
