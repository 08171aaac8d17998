"""Loading a DCP tensor item straight into the tensor it is loaded into.

torch's reader ``torch.load``\\ s each tensor item (a ``torch.save`` archive inside a shard) into a
new tensor and copies that into the destination: a fresh allocation, its page faults and two
copies of every byte. The archive keeps a tensor's bytes uncompressed at an offset its zip
directory gives, so when the part a rank loads is contiguous there, a ``readinto`` from the
shard puts the bytes where they belong: into a host destination of the same dtype directly,
into one on a GPU or of another dtype through a reused (pinned, for a GPU) buffer a chunk at a
time. What this cannot place (bytes items, items written through a storage transform, strided
or several-storage archives, another byte order, a torch whose meta load does not note where
the bytes start) is left to torch's own path.

A large item of a local shard whose bytes are not in memory, bound for a host tensor, is read
with direct I/O (``O_DIRECT``, :class:`DirectFile`): the disk writes into aligned buffers,
several reads in flight, that are copied into the destination, and the page cache is left out.
Read through the page cache, every 4 KiB page of a checkpoint is allocated, inserted, and later
reclaimed by the kernel; on the 2-core machine of ``docs/benchmarks.md`` two ranks each loading
2 GiB that way spent 4 s of kernel time apiece and read at half ``dd``'s rate, and with direct
I/O 0.1 s. Bytes already in memory (a checkpoint just written) are read through the cache,
which is faster there. A GPU destination keeps the buffered stream and its pinned buffer: on
1 x H200 that read at 1.04-1.09x ``dd``, and direct reads one at a time into the pinned buffer
at 0.86x (``docs/gpu-validation.md``).
"""

from __future__ import annotations

import io
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view

__all__ = ["DirectFile", "Found", "Staging", "find", "place"]


@dataclass(frozen=True)
class Found:
    """Where a tensor item's bytes lie in its shard, and the tensor they make (on ``meta``)."""

    start: int
    layout: torch.Tensor


def find(stream: io.IOBase, item: ReadItem, info: Any) -> Found | None:
    """Where the part of a tensor item that ``item`` loads lies in the shard ``stream`` (the
    item's ``_StorageInfo`` is ``info``), or ``None`` when it must take torch's path."""
    if item.type != LoadItemType.TENSOR or getattr(info, "transform_descriptors", None):
        return None
    view = cast(IO[bytes], _create_file_view(stream, info.offset, info.length))
    try:
        archive = torch._C.PyTorchFileReader(view)
    except RuntimeError:  # not a zip archive (a legacy torch.save format)
        return None
    records = archive.get_all_records()
    data = [name for name in records if name.startswith("data/")]
    order = archive.get_record("byteorder").decode() if "byteorder" in records else "little"
    if len(data) != 1 or order != sys.byteorder:
        return None
    view.seek(0)
    # map_location="meta" reads the pickle, not the bytes.
    whole = torch.load(view, map_location="meta", weights_only=True)
    if not isinstance(whole, torch.Tensor):
        return None
    # Where the bytes start, as torch's loader found it (a torch too old to note it here
    # also reads the bytes for a meta load: that one takes torch's path).
    record = getattr(whole.untyped_storage(), "_checkpoint_offset", None)
    part = narrow_tensor_by_index(whole, item.storage_offsets, item.lengths)  # as torch's reader
    if record is None or not part.is_contiguous():
        return None
    return Found(info.offset + record + part.storage_offset() * part.element_size(), part)


class Staging:
    """The host buffers, reused through a load, that bytes pass through on their way into
    their destinations, each starting on a page boundary: one of ``CHUNK`` bytes for the
    buffered stream into another device or dtype, a chunk at a time (pinned for a GPU: a copy
    from pinned memory is one DMA; from fresh pageable memory it waits on page faults and the
    driver's own staging), and ``DEPTH`` of ``DIRECT_CHUNK`` bytes for direct reads in
    flight."""

    CHUNK = 64 << 20
    DIRECT_CHUNK = 16 << 20
    DEPTH = 4

    def __init__(self) -> None:
        self._buffers: dict[tuple[bool, int, int], list[torch.Tensor]] = {}

    def buffer(self, pinned: bool) -> torch.Tensor:
        """``CHUNK`` bytes whose first byte is on a page boundary."""
        return self._aligned(pinned, self.CHUNK, 1)[0]

    def ring(self) -> list[torch.Tensor]:
        """``DEPTH`` buffers of ``DIRECT_CHUNK`` bytes, each starting on a page boundary."""
        return self._aligned(False, self.DIRECT_CHUNK, self.DEPTH)

    def _aligned(self, pinned: bool, size: int, count: int) -> list[torch.Tensor]:
        key = (pinned, size, count)
        if key not in self._buffers:
            align = DirectFile.ALIGN
            raw = torch.empty(count * size + align, dtype=torch.uint8, pin_memory=pinned)
            skip = -raw.data_ptr() % align
            stride = -(-size // align) * align
            self._buffers[key] = [
                raw[skip + k * stride : skip + k * stride + size] for k in range(count)
            ]
        return self._buffers[key]


class DirectFile:
    """A local shard opened a second time for direct I/O, for the large items whose bytes are
    not in memory (see the module docstring). Reads are issued ahead, one thread each, so the
    disk always has some to serve while the bytes of another are copied."""

    ALIGN = 4096
    """Offsets, lengths and buffer addresses of direct reads: every block size in use divides it."""
    MIN_BYTES = 8 << 20
    """Smaller items take the buffered stream, whose read-ahead serves them better."""

    def __init__(self, direct: int, buffered: int) -> None:
        self._direct = direct
        self._buffered = buffered
        self._pool: ThreadPoolExecutor | None = None
        self.refused = False
        """Set when a direct read failed: the rest of the shard takes the buffered stream."""

    def __bool__(self) -> bool:
        return not self.refused

    @classmethod
    def open(cls, path: str) -> DirectFile | None:
        """The file at ``path`` opened for direct reads, or ``None`` where its file system (or
        this platform) has none."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            direct = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flag)
        except OSError:  # EINVAL: a file system without direct I/O
            return None
        try:
            buffered = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(direct)
            return None
        return cls(direct, buffered)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        os.close(self._direct)
        os.close(self._buffered)

    def suits(self, start: int, nbytes: int) -> bool:
        """Whether the ``nbytes`` at ``start`` (an item of the shard) are better read directly:
        many, and not in memory (the page in their middle is asked without waiting). Ask
        before reading any of the shard: a read of an item's header makes the kernel read
        ahead into its bytes."""
        if nbytes < self.MIN_BYTES:
            return False
        try:
            os.preadv(self._buffered, [bytearray(1)], start + nbytes // 2, os.RWF_NOWAIT)
        except BlockingIOError:
            return True  # on disk only
        except (OSError, AttributeError):
            return False  # cannot tell: the cache may well hold them
        return False

    def chunks(
        self, start: int, nbytes: int, ring: list[torch.Tensor], seen: Seen | None = None
    ) -> Iterator[torch.Tensor]:
        """The ``nbytes`` at ``start``, in order, as byte views of the page-aligned buffers of
        ``ring`` (as many reads in flight as it has buffers), each valid until the next is
        asked for. A view need not start on an element's boundary (``start`` is anywhere in
        the file), so it is copied as bytes. ``seen`` is shown each read's bytes in order, by
        the thread that read them once the read before it was shown: the checksum is summed
        beside the copies, not between them."""
        size = min(len(b) for b in ring) // self.ALIGN * self.ALIGN
        if size == 0 or any(b.data_ptr() % self.ALIGN for b in ring):
            raise ValueError("direct reads need page-aligned buffers of a page or more")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(len(ring), thread_name_prefix="direct-read")
        spans = iter(_spans(start, start + nbytes, size, self.ALIGN))
        free = list(ring)
        pending: deque[tuple[int, int, torch.Tensor, Future[None]]] = deque()
        shown: list[Future[None] | None] = [None]  # the read shown last, or to be

        def issue() -> None:
            span = next(spans, None)
            if span is not None:
                first, reach, buffer = *span, free.pop()
                after = (shown[0], start, seen) if seen is not None else None
                read = self._pool.submit(self._read_and_show, buffer, first, reach, after)  # type: ignore[union-attr]
                shown[0] = read
                pending.append((first, reach, buffer, read))

        try:
            for _ in ring:
                issue()
            at = start
            while pending:
                first, reach, buffer, read = pending.popleft()
                read.result()
                yield buffer[at - first : reach - first]
                at = reach
                free.append(buffer)
                issue()
        finally:  # a consumer that stops early: no read may still fill a buffer
            for *_, read in pending:
                read.exception()

    def _read_and_show(
        self,
        buffer: torch.Tensor,
        first: int,
        reach: int,
        after: tuple[Future[None] | None, int, Seen] | None,
    ) -> None:
        """:meth:`_read`; with ``after`` (the read before, the item's start, ``seen``), then
        show the bytes (from the item's start) to ``seen`` once the read before has been."""
        self._read(buffer, first, reach)
        if after is not None:
            before, start, seen = after
            if before is not None:
                before.result()  # submitted earlier to a pool as wide as the ring: it runs
            low = max(first, start)
            seen(low, memoryview(cast(bytearray, buffer.numpy()))[low - first : reach - first])

    def _read(self, buffer: torch.Tensor, first: int, reach: int) -> None:
        """Fill ``buffer`` with the shard's bytes from ``first`` (page-aligned) to ``reach``."""
        view = memoryview(cast(bytearray, buffer.numpy()))
        want = -(-(reach - first) // self.ALIGN) * self.ALIGN
        done = 0
        while first + done < reach:
            got = os.preadv(self._direct, [view[done:want]], first + done)
            if got == 0 or (got % self.ALIGN and first + done + got < reach):
                raise EOFError(f"shard ended {reach - first - done} bytes short of a tensor")
            done += got


def _spans(start: int, end: int, size: int, align: int) -> Iterator[tuple[int, int]]:
    """(first, reach) of each read covering ``start`` to ``end``: ``first`` page-aligned, at
    most ``size`` bytes read; the first read begins at the page that holds ``start``."""
    first = start - start % align
    while first < end:
        reach = min(end, first + size)
        yield first, reach
        first = reach


def place(
    stream: io.IOBase,
    found: Found,
    item: ReadItem,
    planner: LoadPlanner,
    staging: Staging,
    direct: DirectFile | None = None,
    seen: Seen | None = None,
) -> None:
    """Read ``found``'s bytes into the planner's tensor for ``item`` and commit it (through
    ``direct``, when given, into a host tensor of ``DirectFile.MIN_BYTES`` or more: see
    :meth:`DirectFile.suits`); ``seen(offset, bytes)`` is shown every byte read, in order
    (the shard's checksum, summed as the load goes)."""
    summing, seen = seen, seen if seen is not None else _unseen
    target = planner.resolve_tensor(item).detach()
    layout = found.layout
    if target.size() != layout.size():
        raise AssertionError(  # torch's reader raises the same, for the same plan
            f"req {item.storage_index} mismatch sizes {target.size()} vs {layout.size()}"
        )
    into = target if target.is_contiguous() else torch.empty(layout.size(), dtype=layout.dtype)
    flat = into.reshape(-1)
    nbytes = layout.numel() * layout.element_size()
    if into.dtype != layout.dtype:  # a cast: a buffer of whole elements at a time
        stream.seek(found.start)
        chunks = _buffered_chunks(
            stream, nbytes, staging.buffer(into.is_cuda), layout.element_size()
        )
        _copy_into(flat, (c.view(layout.dtype) for c in _shown(chunks, found.start, seen)))
    elif direct and into.device.type == "cpu" and nbytes >= DirectFile.MIN_BYTES:
        try:
            chunks = direct.chunks(found.start, nbytes, staging.ring(), summing)
            _copy_into(flat.view(torch.uint8), chunks)
        except OSError:  # a file system that opens files for direct I/O but refuses the reads
            direct.refused = True
            stream.seek(found.start)
            _fill(stream, flat.view(torch.uint8))
            seen(found.start, _bytes_of(flat))
    elif into.device.type == "cpu":
        stream.seek(found.start)
        _fill(stream, flat.view(torch.uint8))
        seen(found.start, _bytes_of(flat))
    else:  # another device: through the pinned buffer
        stream.seek(found.start)
        chunks = _buffered_chunks(stream, nbytes, staging.buffer(into.is_cuda), 1)
        _copy_into(flat.view(torch.uint8), _shown(chunks, found.start, seen))
    if into is not target:  # a strided destination: the whole part, then one copy
        target.copy_(into)
    planner.commit_tensor(item, target)


Seen = Callable[[int, memoryview], None]


def _unseen(start: int, data: memoryview) -> None:
    pass


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes."""
    return memoryview(cast(bytearray, tensor.reshape(-1).view(torch.uint8).numpy()))


def _shown(chunks: Iterator[torch.Tensor], start: int, seen: Seen) -> Iterator[torch.Tensor]:
    """``chunks`` (byte tensors, consecutive from ``start``), each shown to ``seen`` first."""
    for chunk in chunks:
        seen(start, _bytes_of(chunk))
        start += chunk.numel()
        yield chunk


def _copy_into(flat: torch.Tensor, chunks: Iterator[torch.Tensor]) -> None:
    """Fill the 1-d ``flat`` with ``chunks`` in order (``copy_`` casts and moves them)."""
    done = 0
    for chunk in chunks:
        flat[done : done + chunk.numel()].copy_(chunk)
        done += chunk.numel()


def _buffered_chunks(
    stream: io.IOBase, nbytes: int, buffer: torch.Tensor, unit: int
) -> Iterator[torch.Tensor]:
    """The next ``nbytes`` of ``stream`` as views of ``buffer``, a buffer at a time, each a
    whole number of ``unit``-byte elements."""
    step = buffer.numel() - buffer.numel() % unit
    for first in range(0, nbytes, step):
        chunk = buffer[: min(step, nbytes - first)]
        _fill(stream, chunk)
        yield chunk


def _fill(stream: io.IOBase, into: torch.Tensor) -> None:
    """Read exactly ``into``'s bytes (a contiguous uint8 CPU tensor) from ``stream``."""
    buffer = memoryview(cast(bytearray, into.numpy()))
    done = 0
    while done < len(buffer):
        got = stream.readinto(buffer[done:])  # type: ignore[attr-defined]
        if not got:
            raise EOFError(f"shard ended {len(buffer) - done} bytes short of a tensor")
        done += got
