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
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from typing import IO, Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view

__all__ = ["Found", "Staging", "find", "place"]


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
    """The host buffer, reused through a load, that bytes bound for another device or dtype
    pass through a chunk at a time: pinned for a GPU (a copy from pinned memory is one DMA;
    from fresh pageable memory it waits on page faults and the driver's own staging)."""

    CHUNK = 64 << 20

    def __init__(self) -> None:
        self._buffers: dict[bool, torch.Tensor] = {}

    def buffer(self, pinned: bool) -> torch.Tensor:
        if pinned not in self._buffers:
            self._buffers[pinned] = torch.empty(self.CHUNK, dtype=torch.uint8, pin_memory=pinned)
        return self._buffers[pinned]


def place(
    stream: io.IOBase, found: Found, item: ReadItem, planner: LoadPlanner, staging: Staging
) -> None:
    """Read ``found``'s bytes into the planner's tensor for ``item`` and commit it."""
    target = planner.resolve_tensor(item).detach()
    layout = found.layout
    if target.size() != layout.size():
        raise AssertionError(  # torch's reader raises the same, for the same plan
            f"req {item.storage_index} mismatch sizes {target.size()} vs {layout.size()}"
        )
    stream.seek(found.start)
    if target.is_contiguous() and target.device.type == "cpu" and target.dtype == layout.dtype:
        _fill(stream, target.reshape(-1).view(torch.uint8))
    elif target.is_contiguous():
        _through(stream, layout, target.reshape(-1), staging.buffer(target.is_cuda))
    else:  # a strided destination: the whole part, then one copy
        whole = torch.empty(layout.size(), dtype=layout.dtype)
        _fill(stream, whole.reshape(-1).view(torch.uint8))
        target.copy_(whole)
    planner.commit_tensor(item, target)


def _through(
    stream: io.IOBase, layout: torch.Tensor, flat: torch.Tensor, buffer: torch.Tensor
) -> None:
    """Fill the contiguous ``flat`` with the elements of ``layout``'s dtype that ``stream``
    holds next, a buffer at a time (``copy_`` casts and moves them)."""
    dtype, size = layout.dtype, layout.element_size()
    per = buffer.numel() // size
    for first in range(0, flat.numel(), per):
        count = min(per, flat.numel() - first)
        chunk = buffer[: count * size]
        _fill(stream, chunk)
        flat[first : first + count].copy_(chunk.view(dtype))


def _fill(stream: io.IOBase, into: torch.Tensor) -> None:
    """Read exactly ``into``'s bytes (a contiguous uint8 CPU tensor) from ``stream``."""
    buffer = memoryview(cast(bytearray, into.numpy()))
    done = 0
    while done < len(buffer):
        got = stream.readinto(buffer[done:])  # type: ignore[attr-defined]
        if not got:
            raise EOFError(f"shard ended {len(buffer) - done} bytes short of a tensor")
        done += got
