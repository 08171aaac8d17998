"""``VolumeDataset``: stream the files of a volume through a local cache, sharded by rank and
DataLoader worker, resumable mid-epoch."""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from torch.utils.data import IterableDataset, get_worker_info

from serverless_gpu.data._fs import is_local, resolve
from serverless_gpu.data.cache import CachePin, LocalCache, boot_id, default_cache_dir
from serverless_gpu.data.errors import (
    EmptyVolumeError,
    PositionUnknownError,
    VolumeReadError,
    changed_since_listing,
)
from serverless_gpu.data.in_place import on_same_file_system, read_in_place
from serverless_gpu.data.listing import VolumeFile, copy_file, list_volume
from serverless_gpu.data.position import Fingerprint, Position
from serverless_gpu.data.prefetch import prefetched
from serverless_gpu.data.sharding import (
    Balance,
    ResumePlan,
    batches_for,
    block_share,
    epoch_order,
    rank_block,
    rank_share,
    resume_plan,
    worker_share,
)
from serverless_gpu.data.shards import OpenShard, Sample, index_shards, read_samples, shard_order
from serverless_gpu.data.topology import resolve_topology
from serverless_gpu.data.worker_plan import IterationPlan, WorkerPlan, reseed_worker

__all__ = ["VolumeDataset"]

T = TypeVar("T")


class VolumeDataset(IterableDataset[T]):
    """Iterate over the files of a volume directory, each copied to a node-local cache first
    (a local directory on the cache's own file system is read in place: see ``in_place``).

    Yields the cached file's local path (``str``), or ``transform(local_path)`` when a
    ``transform`` is given (it runs in the DataLoader worker, after which the file may be
    evicted). The file list is taken once, at construction, sorted by relative path.

    Sharding: the epoch order is dealt to ranks (``order[rank::world_size]``) and each rank's
    share to DataLoader workers (``share[worker::num_workers]``); no ``DistributedSampler`` is
    needed. All ranks must use the same ``batch_size`` and ``num_workers`` so they run the same
    number of steps. ``balance`` ("pad", "drop" or "none") handles a file count that is not a
    multiple of ``world_size`` (see :func:`serverless_gpu.data.sharding.rank_share`).

    Position: iterate through :class:`~serverless_gpu.data.VolumeDataLoader` (or
    :meth:`loader`) and :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch with the
    same remaining batches in the same order.

    Args:
        path: directory or fsspec URL (``/data``, ``file://``, ``s3://bucket/prefix``...).
        cache_dir: node-local cache directory shared by all processes of the node
            (default ``$SERVERLESS_GPU_CACHE_DIR`` or ``~/.cache/serverless_gpu/volumes``).
        recursive: list sub-directories too.
        glob: ``fnmatch`` pattern on the relative path.
        transform: turns a local path into the yielded item.
        shuffle: a per-epoch permutation, seeded by ``(seed, epoch)``; see :meth:`set_epoch`.
        seed: the permutation's seed.
        balance: how uneven file counts are split between ranks.
        prefetch: files downloaded ahead by background threads, per DataLoader worker (read in
            place: files the disk is asked to read ahead).
        min_free_bytes: free-disk floor kept on the cache's file system by LRU eviction
            (default 1 GiB).
        pin_window: without ``transform``, the last ``pin_window`` yielded paths of a worker
            are protected from eviction (later ones may be evicted under disk pressure).
        storage_options: passed to fsspec (e.g. ``{"endpoint_url": ...}`` for S3).
        rank: overrides the rank read from ``torch.distributed`` / env vars.
        world_size: overrides the world size read from ``torch.distributed`` / env vars.
        in_place: read a local directory where it lies, without copying it into the cache.
            ``None`` (default): when it is on the same file system as ``cache_dir``, where a
            copy gains no speed and doubles the space; ``True``: any local directory; ``False``:
            always copy (a network or FUSE mount is another file system, so it is copied by
            default). A remote volume is always copied.
        shards: ``"tar"``: the volume's files are tar shards (``glob`` defaults to ``"*.tar"``)
            and the items are their samples, WebDataset's way: a ``dict`` of field name to
            ``bytes`` with ``"__key__"`` (``transform`` gets that dict). Each shard is fetched
            whole (``prefetch`` counts shards), ranks and workers read contiguous parts of the
            epoch order, and ``shuffle`` permutes the shards and the samples within each. See
            :mod:`serverless_gpu.data.shards` for the index that lists the samples.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        recursive: bool = False,
        glob: str | None = None,
        transform: Callable[[Any], T] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        balance: Balance = "pad",
        prefetch: int = 4,
        min_free_bytes: int = 1 << 30,
        pin_window: int = 16,
        storage_options: dict[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        in_place: bool | None = None,
        shards: Literal["tar"] | None = None,
    ) -> None:
        super().__init__()
        if shards not in (None, "tar"):
            raise ValueError(f"shards must be None or 'tar', not {shards!r}")
        self.url = os.fspath(path)
        self.storage_options = dict(storage_options or {})
        if shards is not None and glob is None:
            glob = "*.tar"
        self.files: list[VolumeFile] = list_volume(
            self.url, recursive=recursive, glob=glob, storage_options=self.storage_options
        )
        self.samples: list[Sample] | None = None
        """With ``shards``: every sample of the volume, shard by shard."""
        if shards is not None:
            self.samples = index_shards(self.url, self.files, self.storage_options)
            if not self.samples:
                raise EmptyVolumeError(f"the tar shards of {self.url!r} hold no regular file")
        fs, root = resolve(self.url, self.storage_options)
        # The boot is part of the namespace: the cache publishes files without fsync (8x the
        # copy rate), so a file cached before a crash or power loss is never read again.
        identity = repr(
            (fs.unstrip_protocol(root), sorted(self.storage_options.items()), boot_id())
        )
        namespace = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._cache_namespace = namespace
        self.in_place = self._reads_in_place(fs, root, in_place)
        """Whether this dataset reads its local directory in place (see ``in_place``)."""
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.balance: Balance = balance
        self.prefetch = prefetch
        self.min_free_bytes = min_free_bytes
        self.pin_window = pin_window
        self._explicit_topology = (rank, world_size)
        self._topology = resolve_topology(*self._explicit_topology)
        self._position = Position()
        self._hold_epoch = False
        self._tracked = False
        self._plan: WorkerPlan | None = None
        """Each iteration's epoch, resume point and seed, for persistent workers."""
        self._worker_iterations = 0
        self._local_files: tuple[list[str], list[int]] | None = None
        if self.in_place and self.samples is None:
            self._in_place_files()  # with the listing: an epoch's first item waits for none

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._position.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the shuffle order) of the next iteration.

        A different epoch starts from its first batch; the current epoch keeps its position, so
        the usual ``set_epoch`` call after :meth:`load_state_dict` does not lose the restored
        position. An epoch that was fully consumed is followed by ``epoch + 1`` automatically
        when the loader is iterated again without a ``set_epoch`` call.
        """
        if epoch != self._position.epoch:
            self._position = Position(epoch=epoch)
        self._hold_epoch = True

    def loader(self, **dataloader_kwargs: Any) -> Any:
        """A :class:`~serverless_gpu.data.VolumeDataLoader` over this dataset."""
        from serverless_gpu.data.loader import VolumeDataLoader

        return VolumeDataLoader(self, **dataloader_kwargs)

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: epoch and batches delivered by the ``VolumeDataLoader``."""
        if not self._tracked:
            raise PositionUnknownError(
                "the position is tracked by VolumeDataLoader; iterate with dataset.loader(...)"
            )
        return self._position.to_state(self._fingerprint())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` on the same rank of the same job."""
        self._position = Position.from_state(state, self._fingerprint())
        self._hold_epoch = False

    def epoch_batches(self, *, batch_size: int | None, drop_last: bool, num_workers: int) -> int:
        """Number of batches this rank's loader delivers in a full epoch."""
        workers = max(1, num_workers)
        share = self._rank_share()
        return sum(
            batches_for(len(self._worker_part(share, w, workers)), batch_size, drop_last)
            for w in range(workers)
        )

    def __iter__(self) -> Iterator[T]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if info is None:
            self._topology = resolve_topology(*self._explicit_topology)
        elif self._tracked and self._plan is not None:
            self._follow_plan(worker, workers)
        share = self._rank_share()
        plan = ResumePlan(skip=(0,) * workers, first=0)
        if self._position.batches_consumed:
            plan = resume_plan(
                [len(self._worker_part(share, w, workers)) for w in range(workers)],
                batch_size=self._position.batch_size,
                drop_last=self._position.drop_last,
                batches_consumed=self._position.batches_consumed,
            )
        # Rotating the streams makes the resumed DataLoader's round-robin continue in order.
        source = (plan.first + worker) % workers
        mine = self._worker_part(share, source, workers)[plan.skip[source] :]
        return self._read(mine)

    def _reads_in_place(self, fs: Any, root: str, in_place: bool | None) -> bool:
        if not is_local(fs):
            if in_place:
                raise ValueError(f"in_place=True needs a local directory, not {self.url!r}")
            return False
        if in_place is None:
            return on_same_file_system(root, self.cache_dir)
        return in_place

    def _read(self, indices: list[int]) -> Iterator[Any]:
        # Iterators, not a generator here: a layer less for every item of a fast local read.
        if self.samples is not None:
            samples = read_samples(self.samples, indices, self._open_shard, ahead=self.prefetch)
            return samples if self.transform is None else map(self.transform, samples)
        if self.in_place:
            paths, sizes = self._in_place_files()
            return read_in_place(
                [paths[i] for i in indices], [sizes[i] for i in indices], self.prefetch,
                self.transform,
            )  # fmt: skip
        return self._read_cached(indices)

    def _in_place_files(self) -> tuple[list[str], list[int]]:
        """Every listed file's local path and listed size (made once: the listing is fixed)."""
        if self._local_files is None:
            folder = os.path.join(resolve(self.url, self.storage_options)[1], "")
            self._local_files = (
                [folder + f.relpath for f in self.files],
                [f.size for f in self.files],
            )
        return self._local_files

    def _read_cached(self, indices: list[int]) -> Iterator[Any]:
        cache = self._cache()
        recent: deque[CachePin] = deque()

        def fetch(index: int) -> CachePin:
            return self._fetch(cache, self.files[index])

        try:
            for pin in prefetched(indices, fetch, depth=self.prefetch, release=CachePin.close):
                if self.transform is not None:
                    with pin:
                        item: Any = self.transform(str(pin.path))
                else:
                    item = str(pin.path)
                    recent.append(pin)
                    while len(recent) > self.pin_window:
                        recent.popleft().close()
                yield item
        finally:
            for pin in recent:
                pin.close()

    def _open_shard(self, number: int) -> OpenShard:
        shard = self.files[number]
        if not self.in_place:
            pin = self._fetch(self._cache(), shard)
            return OpenShard(pin.fileno(), shard.relpath, pin.close)
        path = os.path.join(resolve(self.url, self.storage_options)[1], shard.relpath)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise VolumeReadError(f"cannot read {path}: {exc}") from exc
        if (size := os.fstat(fd).st_size) != shard.size:
            os.close(fd)
            raise changed_since_listing(path, size, shard.size)
        return OpenShard(fd, path, partial(os.close, fd))

    def _cache(self) -> LocalCache:
        return LocalCache(
            self.cache_dir,
            namespace=self._cache_namespace,
            min_free_bytes=self.min_free_bytes,
            durable=False,
        )

    def _fetch(self, cache: LocalCache, file: VolumeFile) -> CachePin:
        copy = partial(copy_file, self.url, file.relpath, max_bytes=file.size)
        copy = partial(copy, storage_options=self.storage_options)
        return cache.acquire(file.relpath, file.size, copy, version=file.version)

    def _rank_share(self) -> list[int]:
        rank, world_size = self._topology
        epoch, seed, shuffle = self._position.epoch, self.seed, self.shuffle
        if self.samples is not None:
            order = shard_order(self.samples, epoch=epoch, seed=seed, shuffle=shuffle)
            return rank_block(order, rank=rank, world_size=world_size, balance=self.balance)
        order = epoch_order(len(self.files), epoch=epoch, seed=seed, shuffle=shuffle)
        return rank_share(order, rank=rank, world_size=world_size, balance=self.balance)

    def _worker_part(self, share: list[int], worker: int, workers: int) -> list[int]:
        if self.samples is not None:  # contiguous: a worker fetches only its own shards
            return block_share(share, part=worker, parts=workers)
        return worker_share(share, worker=worker, num_workers=workers)

    def _fingerprint(self) -> Fingerprint:
        names = "\n".join(f.relpath for f in self.files).encode()
        if self.samples is not None:
            names += "\n".join(s.key for s in self.samples).encode()
        rank, world_size = self._topology
        return Fingerprint(
            num_files=len(self.files) if self.samples is None else len(self.samples),
            files_digest=hashlib.sha256(names).hexdigest(),
            shuffle=self.shuffle,
            seed=self.seed,
            balance=self.balance,
            rank=rank,
            world_size=world_size,
        )

    # Hooks for VolumeDataLoader, which runs in the training process and counts batches.
    def _begin_iteration(
        self, *, batch_size: int | None, drop_last: bool, num_workers: int
    ) -> None:
        self._tracked = True
        self._topology = resolve_topology(*self._explicit_topology)
        workers = max(1, num_workers)
        position = self._position
        position.check_loader(batch_size=batch_size, drop_last=drop_last, num_workers=workers)
        total = self.epoch_batches(batch_size=batch_size, drop_last=drop_last, num_workers=workers)
        if total == 0:
            rank, world_size = self._topology
            raise EmptyVolumeError(
                f"rank {rank} of {world_size} gets no batch from {len(self.files)} files "
                f"(balance={self.balance!r}, batch_size={batch_size}, drop_last={drop_last})"
            )
        if position.batches_consumed >= total and not self._hold_epoch:
            position = self._position = Position(epoch=position.epoch + 1)
        position.batch_size = batch_size
        position.drop_last = drop_last
        position.num_workers = workers
        self._hold_epoch = False

    def _share_plan(self, base_seed: int) -> None:
        """After ``_begin_iteration``: what this iteration's workers must follow (persistent
        ones kept the copy of the dataset they started with)."""
        position = self._position
        if self._plan is None:
            self._plan = WorkerPlan()
        self._plan.write(
            IterationPlan(
                epoch=position.epoch,
                batches_consumed=position.batches_consumed,
                batch_size=position.batch_size,
                drop_last=position.drop_last,
                base_seed=base_seed,
            )
        )

    def _follow_plan(self, worker: int, workers: int) -> None:
        """In a worker: take this iteration's position from the training process; from a
        persistent worker's second iteration on, seed it as torch seeds a fresh worker."""
        assert self._plan is not None
        plan = self._plan.read()
        self._position = Position(
            epoch=plan.epoch,
            batches_consumed=plan.batches_consumed,
            batch_size=plan.batch_size,
            drop_last=plan.drop_last,
            num_workers=workers,
        )
        if self._worker_iterations:
            reseed_worker(plan.base_seed, worker)
        self._worker_iterations += 1

    def _count_batch(self) -> None:
        self._position.batches_consumed += 1

    def _mark_tracked(self) -> None:
        self._tracked = True
