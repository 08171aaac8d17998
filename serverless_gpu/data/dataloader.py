"""``DataLoader``: torch's ``DataLoader`` with worker processes by default, kept across epochs,
a resumable position for :class:`~serverless_gpu.data.Checkpointable` datasets, and each
rank's batch timing logged to the call's MLflow run (:mod:`serverless_gpu.data.batch_timing`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any, NamedTuple

import torch.utils.data
from torch.utils.data import get_worker_info

from serverless_gpu.data.batch_timing import LOG_INTERVAL_S, METRICS, Delivered, timed
from serverless_gpu.data.checkpointable import Checkpointable
from serverless_gpu.data.inline_tensors import InlineSmallTensors
from serverless_gpu.data.worker_options import worker_options
from serverless_gpu.rank import runtime

__all__ = ["LOG_INTERVAL_S", "METRICS", "DataLoader"]

STATE_VERSION = 1
_MAX_DEFAULT_WORKERS = 8


def default_num_workers() -> int:
    """This node's cores shared between its ranks, at most 8 per rank, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(_MAX_DEFAULT_WORKERS, (cores or 1) // runtime.get_local_world_size()))


class _Delivered(NamedTuple):
    """A batch on its way from a worker, with that worker's dataset state after making it (a
    named tuple: ``pin_memory`` keeps the type and pins the batch inside)."""

    batch: Any
    worker: int
    state: dict[str, Any]


class _StateCollate:
    """The loader's ``collate_fn`` in the worker: the batch, then the worker's state."""

    def __init__(self, collate: Callable[[Any], Any], dataset: Checkpointable) -> None:
        self.collate = collate
        self.dataset = dataset  # the copy a loader without workers iterates

    def __call__(self, items: Any) -> _Delivered:
        batch = self.collate(items)
        info = get_worker_info()
        if info is None:
            return _Delivered(batch, 0, self.dataset.state_dict())
        return _Delivered(batch, info.id, info.dataset.state_dict())  # type: ignore[attr-defined]


class _ResumeInit:
    """The loader's ``worker_init_fn``: the worker's copy takes its own saved state first."""

    def __init__(self, states: dict[int, Any], user_init: Callable[[int], None] | None) -> None:
        self.states = states  # read in the worker: its copy as of the worker's start
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        state = self.states.get(worker_id)
        if state is not None:
            get_worker_info().dataset.load_state_dict(state)  # type: ignore[union-attr]
        if self.user_init is not None:
            self.user_init(worker_id)


class DataLoader(torch.utils.data.DataLoader[Any]):
    """``torch.utils.data.DataLoader`` for training in a rank; every torch argument works.

    Differences: ``num_workers`` defaults to the node's cores shared between its ranks (at
    most 8), ``prefetch_factor`` to 4 and ``persistent_workers`` to True when there are
    workers (each can be given), and a worker sends tensors of up to 128 KiB by value, not
    through shared memory (:mod:`serverless_gpu.data.inline_tensors`). With a
    :class:`Checkpointable` dataset, :meth:`state_dict`
    and :meth:`load_state_dict` resume mid-epoch, each worker where the training loop stopped
    receiving its batches. Batch timing goes to the call's MLflow run (module docstring).
    """

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        num_workers: int | None = None,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        **kwargs: Any,
    ) -> None:
        workers = default_num_workers() if num_workers is None else num_workers
        super().__init__(  # type: ignore[misc]  # torch's positional arguments end before these
            dataset,
            *args,
            num_workers=workers,
            **worker_options(workers, prefetch_factor, persistent_workers),
            **kwargs,
        )
        self._delivered = Delivered()
        self._received: dict[int, Any] | None = None
        """Worker -> its state after the last batch the loop received; None: not resumable."""
        self._resume: dict[int, Any] = {}
        self._start_from: dict[int, Any] = {}
        _check_dataset(dataset)
        if isinstance(dataset, Checkpointable):
            self._received = {}
            self.collate_fn = _StateCollate(self.collate_fn, dataset)
            self.worker_init_fn = _ResumeInit(self._resume, self.worker_init_fn)
        self.worker_init_fn = InlineSmallTensors(self.worker_init_fn)

    def state_dict(self) -> dict[str, Any]:
        """Where every worker's stream stands, with the rank, world size and worker count it
        holds for (a checkpoint resumes only on the same)."""
        received = self._checkpointable("state_dict")
        return {
            "version": STATE_VERSION,
            "rank": runtime.get_global_rank(),
            "world_size": runtime.get_world_size(),
            "num_workers": self.num_workers,
            "per_worker": dict(received),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s value at the next iteration. A different world
        size, worker count or rank is a ``ValueError`` naming both values."""
        self._checkpointable("load_state_dict")
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"a DataLoader state of version {state.get('version')!r}; this loader reads "
                f"version {STATE_VERSION}"
            )
        _same("world_size", state["world_size"], runtime.get_world_size())
        _same("num_workers", state["num_workers"], self.num_workers)
        _same("rank", state["rank"], runtime.get_global_rank())
        per_worker = {int(w): s for w, s in state["per_worker"].items()}  # JSON keys: strings
        self._resume.clear()
        self._resume.update(per_worker)
        if self.num_workers == 0 and 0 in per_worker:
            self.dataset.load_state_dict(per_worker[0])  # type: ignore[attr-defined]
        self._received = dict(per_worker)
        self._start_from = dict(per_worker)
        # Persistent workers hold the copies they started with: start new ones.
        iterator = getattr(self, "_iterator", None)
        if iterator is not None:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self._iterator = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._received is not None:
            # An epoch starts where the last resume put it, else from the beginning.
            self._received.clear()
            self._received.update(self._start_from)
            self._start_from = {}
        batches = super().__iter__()
        self._resume.clear()  # the workers started have their states; later ones start anew
        return self._timed(batches)

    def _timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        with closing(timed(batches, self._delivered)) as delivered:
            for value in delivered:
                if isinstance(value, _Delivered):
                    if self._received is not None:
                        self._received[value.worker] = value.state
                    value = value.batch
                yield value

    def _checkpointable(self, what: str) -> dict[int, Any]:
        if self._received is None:
            raise TypeError(
                f"DataLoader.{what}() needs a Checkpointable dataset (state_dict and "
                f"load_state_dict methods); {type(self.dataset).__name__} has none"
            )
        return self._received


def _check_dataset(dataset: object) -> None:
    from serverless_gpu.data.dataset import VolumeDataset
    from serverless_gpu.data.uc_dataset import UCVolumeDataset

    if isinstance(dataset, VolumeDataset) and not isinstance(dataset, UCVolumeDataset):
        raise TypeError(
            "a VolumeDataset keeps its position through VolumeDataLoader: iterate it with "
            "dataset.loader(...), or use UCVolumeDataset, whose position DataLoader keeps"
        )


def _same(name: str, saved: object, now: object) -> None:
    if saved != now:
        raise ValueError(
            f"this DataLoader state was saved with {name}={saved!r} and this loader runs with "
            f"{name}={now!r}: a worker's position means something only on the same ranks and "
            f"workers; resume with {name}={saved!r}, or start the epoch again"
        )
