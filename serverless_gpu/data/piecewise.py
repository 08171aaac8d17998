"""Files whose every ``write(2)`` is at most :data:`PIECE` bytes.

A buffered write copies the caller's bytes into the page cache's folios. On some kernels
(Linux 6.18 on ext4, the 2-core machine of ``docs/benchmarks.md``) one ``write`` of 2 MiB or
more runs at 140-170 MB/s, the kernel's time all in that copy (``copy_folio_from_iter_atomic``,
seen with ``perf``), where writes of 256 KiB run at about 4 GB/s (``benchmarks/data_io.py``):
a cache that wrote an 8 MiB part in one call filled at disk speed what the page cache takes at
memory speed. Writing in pieces costs a syscall per 256 KiB elsewhere (boto3 writes downloads
in pieces of the same size), so the cache's copies and the checkpoint's shards always do.

A file that will be fsynced when complete (a checkpoint shard) is opened with
``write_behind``: every :data:`WRITE_BEHIND` bytes the kernel is asked to start writing what is
dirty (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait), so the disk works
while the rest is copied in, instead of after (``benchmarks/checkpoint.py --full``: a 1 GiB
save at 0.69x ``dd`` without it, 0.95x and 1.13x in two runs with it; the outputs are in
``benchmarks/results/checkpoint-full-2core*.md``).
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
from collections.abc import Callable
from typing import Any

__all__ = ["PIECE", "WRITE_BEHIND", "PiecewiseFileIO", "open_piecewise"]

PIECE = 256 << 10
WRITE_BEHIND = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2


class PiecewiseFileIO(io.FileIO):
    """``io.FileIO`` that splits a large write into :data:`PIECE`-byte ``write`` calls, and
    with ``write_behind`` starts the write-back of its dirty pages as it goes."""

    def __init__(
        self,
        file: str | int,
        mode: str,
        *,
        write_behind: bool = False,
        on_bytes: Callable[[int, memoryview], None] | None = None,
    ) -> None:
        super().__init__(file, mode)
        self._on_bytes = on_bytes
        """Shown each piece just written, at its offset (while hot in the CPU's cache)."""
        self._at = 0
        self._start_writeback = _sync_file_range() if write_behind else None
        self._unflushed = 0

    def write(self, b: Any, /) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            written = super().write(view[done : done + PIECE])
            if not written:  # a non-blocking descriptor that is full: what went, as FileIO does
                return done
            if self._on_bytes is not None:
                self._on_bytes(self._at, view[done : done + written])
            self._at += written
            done += written
            self._unflushed += written
            if self._unflushed >= WRITE_BEHIND:
                self._unflushed = 0
                if self._start_writeback is not None:
                    # Offset 0, length 0: every dirty page of the file not already being written.
                    self._start_writeback(self.fileno(), 0, 0, _SYNC_FILE_RANGE_WRITE)
        return done

    def seek(self, pos: int, whence: int = 0, /) -> int:
        self._at = super().seek(pos, whence)
        return self._at


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range``, or ``None`` where there is none (not Linux)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def open_piecewise(
    file: str | os.PathLike[str] | int,
    mode: str = "wb",
    *,
    write_behind: bool = False,
    on_bytes: Callable[[int, memoryview], None] | None = None,
) -> io.BufferedWriter:
    """A binary file open for writing (``mode`` ``"wb"``, ``"xb"`` or ``"ab"``; a descriptor
    is owned and closed by the file) whose writes reach the kernel in pieces; with
    ``write_behind``, for a file that will be fsynced, its write-back starts as it grows."""
    if "r" in mode or "+" in mode or "b" not in mode:
        raise ValueError(f"open_piecewise opens binary files for writing only, not {mode!r}")
    target = file if isinstance(file, int) else os.fspath(file)
    raw = PiecewiseFileIO(
        target,
        mode.replace("b", ""),
        write_behind=write_behind,
        on_bytes=on_bytes,
    )
    return io.BufferedWriter(raw, PIECE)
