"""``torch.distributed.checkpoint`` storage over fsspec URLs with local staging and an atomic,
last-step ``.metadata`` publish.

Built on torch's ``FsspecWriter`` / ``FsspecReader`` (and so ``FileSystemWriter``: planning,
shard files, ``dcp.async_save`` staging). Only the byte transport is replaced:

* every file is written to local disk first and uploaded when complete (local destinations get
  a temp name in the same directory and ``os.replace``), so no reader sees a torn shard;
* ``write_data`` returns after its uploads finished, and DCP runs ``finish`` on the coordinator
  only after every rank's ``write_data`` result arrived; ``finish`` uploads ``.metadata.tmp`` and
  renames it to ``.metadata`` (``os.rename`` locally, a single-object copy on object stores), so
  ``.metadata`` appears last and whole;
* the coordinator deletes a stale ``.metadata`` before any shard is overwritten, so a directory
  being re-written never looks complete;
* a save killed mid-way leaves its staged files behind; the next save deletes them before it
  writes (the coordinator those beside the shards, each rank those of dead processes in its
  staging directory).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import secrets
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _TorchFsspecFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from serverless_gpu.data import checkpoint_faults, dcp_read, stale_parts
from serverless_gpu.data._fs import is_local
from serverless_gpu.data.errors import (
    CorruptCheckpointError,
    IncompleteCheckpointError,
    VolumeReadError,
)
from serverless_gpu.data.piecewise import open_piecewise
from serverless_gpu.data.shard_checksums import (
    ATTR,
    ReadSum,
    Recorded,
    WrittenSum,
    algorithm,
    check,
    checked,
    sum_of,
)
from serverless_gpu.runfiles.private_dirs import not_planted

__all__ = ["METADATA", "UCVolumeReader", "UCVolumeWriter", "VolumeReader", "VolumeWriter"]

METADATA = ".metadata"


class _StagedFileSystem(_TorchFsspecFileSystem):
    """torch's fsspec file system, writing through local staging and remembering
    ``storage_options`` (torch's ``reset(checkpoint_id)`` re-inits the path without them)."""

    def __init__(self, storage_options: dict[str, Any], staging_dir: str | None) -> None:
        super().__init__()
        self.storage_options = dict(storage_options)
        # Found here, in the caller's thread, not by the upload thread of dcp.async_save: a
        # process's first gettempdir() holds tempfile's module lock, which CPython does not
        # reset in a forked child, so a DataLoader forking its workers meanwhile would hand
        # them a lock nobody releases (their queue threads name sockets with tempfile).
        self.staging_dir = staging_dir if staging_dir is not None else tempfile.gettempdir()
        self.checksums: dict[str, Recorded] | None = None
        """Each shard's size and checksum by file name, as written (``None``: not summed)."""

    def init_path(self, path: str | os.PathLike[str], **kwargs: Any) -> str | os.PathLike[str]:
        self.fs, _ = url_to_fs(os.fspath(path), **(kwargs or self.storage_options))
        return path

    @contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        if not any(flag in mode for flag in "wax+"):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        assert self.fs is not None
        if is_local(self.fs):
            final = self._local(path)
            # The pid: a save into the same folder deletes only the parts of dead writers.
            staged = final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        else:
            os.makedirs(self.staging_dir, exist_ok=True)
            staged = Path(self.staging_dir) / f"dcp-{os.getpid()}-{secrets.token_hex(8)}.part"
        summed = WrittenSum(algorithm()) if self.checksums is not None else None
        try:
            shown = summed.wrote if summed is not None else None
            with open_piecewise(staged, mode, write_behind=True, on_bytes=shown) as stream:
                yield stream
            if summed is not None and self.checksums is not None:
                self.checksums[Path(os.fspath(path)).name] = summed.result(staged)
            if is_local(self.fs):
                os.replace(staged, final)
            else:
                self.fs.put_file(os.fspath(staged), os.fspath(path))
        except Exception as exc:
            better = checkpoint_faults.explained(exc, staged, path)
            if better is None:
                raise
            raise better from exc
        finally:
            staged.unlink(missing_ok=True)

    def drop_torn(self, checkpoint: str | os.PathLike[str]) -> None:
        """Delete the shards a killed save staged beside their final names in ``checkpoint``
        (those of processes that no longer exist); only before any rank of this save writes
        (the coordinator's global plan)."""
        if self.fs is not None and is_local(self.fs):
            stale_parts.drop_torn(self._local(checkpoint))

    def drop_orphans(self) -> None:
        """Delete the shards that processes which no longer exist staged for upload."""
        stale_parts.drop_staged(Path(self.staging_dir))

    def check_not_planted(self, path: str | os.PathLike[str]) -> None:
        if self.fs is not None and is_local(self.fs):
            not_planted(self._local(path), "the checkpoint path", "checkpoint")

    def _local(self, path: str | os.PathLike[str]) -> Path:
        assert self.fs is not None
        return Path(self.fs._strip_protocol(os.fspath(path)))


class VolumeWriter(FsspecWriter):
    """DCP ``StorageWriter`` for a directory or fsspec URL; use with ``dcp.save`` /
    ``dcp.async_save``. A checkpoint directory is complete iff it has ``.metadata``.

    Args:
        path: checkpoint directory (``/ckpt/step_000100``, ``s3://bucket/run/step_000100``).
        storage_options: fsspec options (e.g. ``{"endpoint_url": ...}``).
        staging_dir: local directory for shards before upload (default: the temp dir).
        checksums: record each shard's size and checksum in ``.metadata``, for
            :class:`VolumeReader` and :func:`latest_checkpoint` to check.
        **kwargs: torch ``FileSystemWriter`` options (``thread_count``, ``overwrite``...).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        checksums: bool = True,
        **kwargs: Any,
    ) -> None:
        options = dict(storage_options or {})
        super().__init__(path, **kwargs, **options)
        staging = os.fspath(staging_dir) if staging_dir is not None else None
        self._staged = _StagedFileSystem(options, staging)
        self._staged.checksums = {} if checksums else None
        # torch annotates ``fs`` with its local FileSystem although FsspecWriter stores its own.
        self.fs = self._staged  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Each rank, before it writes: staged files of killed saves go; the step folder
        (torch makes it here) must be ours."""
        self._staged.drop_orphans()
        plan = super().prepare_local_plan(plan)
        self._staged.check_not_planted(self.path)
        return plan

    def write_data(self, plan: SavePlan, planner: Any) -> Future[list[WriteResult]]:
        """torch's, then each item's storage record notes its shard's size and checksum (see
        :mod:`~serverless_gpu.data.shard_checksums`); torch completes the future before it
        returns it."""
        done = super().write_data(plan, planner)
        sums = self._staged.checksums
        if sums is not None and done.done():
            for result in done.wait():
                found = sums.get(getattr(result.storage_data, "relative_path", ""))
                if found is not None:
                    setattr(result.storage_data, ATTR, tuple(found))  # torch needs not us
        return done

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator step after every rank planned and before any rank writes: unpublish a
        stale ``.metadata`` so a half-overwritten directory is never taken as complete, and
        delete the partial shards a killed save left."""
        stale = self.fs.concat_path(self.path, METADATA)
        if self.fs.exists(stale):
            self.fs.rm_file(stale)
        self._staged.drop_torn(self.path)
        return super().prepare_global_plan(plans)


class VolumeReader(FsspecReader):
    """DCP ``StorageReader`` for a checkpoint written by :class:`VolumeWriter` (``dcp.load``).

    Raises :class:`IncompleteCheckpointError` when the directory has no ``.metadata``, and
    :class:`CorruptCheckpointError` when a shard does not match the size and checksum recorded
    when it was saved (``verify=False`` loads it anyway; a shard with none is not checked).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        verify: bool = True,
    ) -> None:
        options = dict(storage_options or {})
        self.verify = verify
        super().__init__(path, **options)
        self._staged = _StagedFileSystem(options, None)
        self.fs = self._staged  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read ``.metadata``; a missing one means the save never completed."""
        metadata_path = self._get_metadata_path(kwargs.get("rank"))
        if not self.fs.exists(metadata_path):
            if kwargs.get("rank") is not None and self.fs.exists(self._get_metadata_path()):
                # torch asks for a rank's own file after ``.metadata`` failed to read: say why
                # that one failed, not that the rank's is missing.
                return self.read_metadata()
            raise IncompleteCheckpointError(
                f"{os.fspath(self.path)} has no {METADATA}: the checkpoint is incomplete "
                "(a save was interrupted) or does not exist"
            )
        try:
            return super().read_metadata(*args, **kwargs)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
            size = self._staged.fs.size(metadata_path)  # type: ignore[union-attr]
            message = checkpoint_faults.damaged_metadata(os.fspath(metadata_path), size, exc)
            raise CorruptCheckpointError(message) from exc

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read this rank's items, after checking that their shards are whole: tensors straight
        into their destinations where their layout allows, the rest through torch's reader."""
        self._check_shards(plan)
        rest = self._read_direct(plan.items, planner)
        if rest:
            return super().read_data(dataclasses.replace(plan, items=rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_direct(self, items: list[ReadItem], planner: LoadPlanner) -> list[ReadItem]:
        """Read the items that allow it straight into their destinations, shard by shard in
        offset order (a sequential read of each shard); return those left for torch's path."""
        info = self.storage_data
        rest: list[ReadItem] = []
        per_file: dict[str, list[ReadItem]] = {}
        for item in sorted(items, key=lambda item: info[item.storage_index].offset):
            per_file.setdefault(info[item.storage_index].relative_path, []).append(item)
        staging = dcp_read.Staging()
        for relative_path, reqs in per_file.items():
            self._read_shard(relative_path, reqs, planner, staging, rest)
        return rest

    def _read_shard(
        self,
        relative_path: str,
        reqs: list[ReadItem],
        planner: LoadPlanner,
        staging: dcp_read.Staging,
        rest: list[ReadItem],
    ) -> None:
        """:meth:`_read_direct` for one shard, its checksum summed from what is read."""
        info = self.storage_data
        shard = self.fs.concat_path(self.path, relative_path)
        large = any(info[r.storage_index].length >= dcp_read.DirectFile.MIN_BYTES for r in reqs)
        direct = self._direct_file(shard) if large else None
        want = checked(info[reqs[0].storage_index]) if self.verify else None
        gaps = self._staged.fs.open(os.fspath(shard), "rb") if want else None  # type: ignore[union-attr]
        summed = ReadSum(partial(_read_at, gaps), want.algorithm) if want else None
        try:
            # Asked before any byte of the shard is read: reading an item's header makes
            # the kernel read ahead into its bytes.
            on_disk = [
                direct is not None
                and direct.suits(info[r.storage_index].offset, info[r.storage_index].length)
                for r in reqs
            ]
            with self.fs.create_stream(shard, "rb") as stream:
                for item, cold in zip(reqs, on_disk, strict=True):
                    found = dcp_read.find(stream, item, info[item.storage_index])
                    if found is None:
                        rest.append(item)
                        continue
                    seen = summed.feed if summed is not None else None
                    direct_file = direct if cold else None
                    dcp_read.place(stream, found, item, planner, staging, direct_file, seen)
            if summed is not None and want is not None:
                check(os.fspath(shard), self.path, summed.finish(want[0]), want)
        finally:
            if direct is not None:
                direct.close()
            if gaps is not None:
                gaps.close()

    def _direct_file(self, shard: str | os.PathLike[str]) -> dcp_read.DirectFile | None:
        """A local shard opened for direct reads too (see :mod:`serverless_gpu.data.dcp_read`)."""
        fs = self._staged.fs
        if fs is None or not is_local(fs):
            return None
        return dcp_read.DirectFile.open(os.fspath(self._staged._local(shard)))

    def _check_shards(self, plan: LoadPlan) -> None:
        """A shard shorter than ``.metadata`` says (a copy cut short, a full disk) is an error
        naming it, not an unpickling error from inside torch partway through the load."""
        needed: dict[str, int] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            end = info.offset + info.length
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
        fs = self._staged.fs
        assert fs is not None  # set by init_path
        for relpath, end in sorted(needed.items()):
            shard = os.fspath(self.fs.concat_path(self.path, relpath))
            try:
                size: int | None = fs.size(shard)
            except FileNotFoundError:
                size = None
            if size is None or size < end:
                found = "missing" if size is None else f"{size} bytes"
                raise VolumeReadError(
                    f"checkpoint shard {shard} is {found}, and the checkpoint's {METADATA} "
                    f"needs {end}: it was cut short after the save; restore it from a copy, "
                    "or load an earlier checkpoint"
                )

    def check_checksums(self) -> None:
        """Read each shard whose size and checksum ``.metadata`` records, and raise
        :class:`CorruptCheckpointError` naming the first that differs."""
        want = {info.relative_path: checked(info) for info in self.storage_data.values()}
        fs = self._staged.fs
        assert fs is not None  # set by init_path
        for relpath, sums in sorted(want.items()):
            if sums is not None:
                shard = os.fspath(self.fs.concat_path(self.path, relpath))
                with fs.open(shard, "rb") as stream:
                    check(shard, self.path, sum_of(stream, sums.algorithm), sums)


def _read_at(stream: Any, view: memoryview, offset: int) -> int:
    stream.seek(offset)
    return int(stream.readinto(view) or 0)


UCVolumeWriter = VolumeWriter
"""Alias for code migrating from the original product."""
UCVolumeReader = VolumeReader
"""Alias for code migrating from the original product."""
