"""``VolumeDataLoader``: a ``DataLoader`` that records how many batches reached the loop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils.data import DataLoader

from serverless_gpu.data.batch_timing import Delivered, timed
from serverless_gpu.data.inline_tensors import InlineSmallTensors
from serverless_gpu.data.sharding import epoch_seed
from serverless_gpu.data.worker_options import worker_options
from serverless_gpu.data.worker_plan import torch_base_seed

if TYPE_CHECKING:
    # VolumeDataset.loader() makes this loader: a runtime import would be a cycle.
    from serverless_gpu.data.dataset import VolumeDataset

__all__ = ["VolumeDataLoader"]

_HOOKS = ("_begin_iteration", "_share_plan", "_count_batch", "_mark_tracked")
"""What a VolumeDataset offers its loader (the test of being one, without importing it)."""


class VolumeDataLoader(DataLoader[Any]):
    """A :class:`torch.utils.data.DataLoader` over a :class:`VolumeDataset` that tracks position.

    Every batch handed to the training loop increments the dataset's position, so
    ``dataset.state_dict()`` taken between steps says exactly which batches were consumed.
    Worker seeds come from a private generator seeded by ``(dataset.seed, epoch)`` unless a
    ``generator`` is passed. With workers, ``persistent_workers`` defaults to True and
    ``prefetch_factor`` to 4, as for :class:`~serverless_gpu.data.DataLoader`: the workers
    start once and follow each epoch, resume point and seed the training process sets (a
    ``worker_init_fn`` runs once, at their start); ``close()`` stops them. A worker sends
    tensors of up to 128 KiB by value, not through shared memory
    (:mod:`serverless_gpu.data.inline_tensors`). Options that would make the delivery order
    non-deterministic (``in_order=False``, a ``sampler``) are refused.
    One iterator at a time per loader. Batch timing goes to the call's MLflow run as
    :class:`~serverless_gpu.data.DataLoader`'s does.
    """

    def __init__(self, dataset: VolumeDataset[Any], **kwargs: Any) -> None:
        if not all(hasattr(dataset, hook) for hook in _HOOKS):
            raise TypeError(f"VolumeDataLoader needs a VolumeDataset, got {type(dataset).__name__}")
        if kwargs.get("in_order", True) is not True:
            raise ValueError(f"VolumeDataLoader does not support in_order={kwargs['in_order']!r}")
        for name in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(name) not in (None, False):
                raise ValueError(f"{name} does not apply: VolumeDataset shards and shuffles itself")
        # A private generator keeps worker seeding off the global RNG, so creating an iterator
        # (e.g. when resuming mid-epoch) does not shift the training loop's random numbers.
        self._owns_generator = kwargs.get("generator") is None
        if self._owns_generator:
            kwargs["generator"] = torch.Generator()
        kwargs["worker_init_fn"] = InlineSmallTensors(kwargs.get("worker_init_fn"))
        kwargs.update(
            worker_options(
                kwargs.get("num_workers", 0),
                kwargs.get("prefetch_factor"),
                kwargs.get("persistent_workers"),
            )
        )
        super().__init__(dataset, **kwargs)
        self._delivered = Delivered()
        dataset._mark_tracked()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset = cast("VolumeDataset[Any]", self.dataset)
        dataset._begin_iteration(
            batch_size=self.batch_size, drop_last=self.drop_last, num_workers=self.num_workers
        )
        if self._owns_generator and self.generator is not None:
            self.generator.manual_seed(epoch_seed(dataset.seed, dataset.epoch))
        if self.num_workers > 0:
            generator = self.generator if self.generator is not None else torch.Generator()
            dataset._share_plan(torch_base_seed(generator))
        return self._counted(dataset)

    def _counted(self, dataset: VolumeDataset[Any]) -> Iterator[Any]:
        batches = super().__iter__()
        try:
            with closing(timed(batches, self._delivered)) as delivered:
                for batch in delivered:
                    dataset._count_batch()
                    yield batch
        except GeneratorExit:  # the loop stopped early: persistent workers serve the next one
            if not self.persistent_workers:
                _shutdown(batches)
            raise
        except BaseException:
            # An exception's traceback keeps the DataLoader iterator (and so its worker
            # processes) alive; stop the workers now rather than whenever it is collected.
            self._drop(batches)
            raise
        if not self.persistent_workers:
            _shutdown(batches)

    def close(self) -> None:
        """Stop the workers now (with ``persistent_workers=True`` they otherwise live until
        this loader is garbage-collected); a later iteration starts new ones."""
        if self._iterator is not None:
            self._drop(self._iterator)

    def _drop(self, batches: Any) -> None:
        _shutdown(batches)
        if self._iterator is batches:  # torch would resume the stopped workers next time
            self._iterator = None


def _shutdown(batches: Any) -> None:
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
