"""Files whose every ``write(2)`` is at most :data:`PIECE` bytes.

A buffered write copies the caller's bytes into the page cache's folios. On some kernels
(Linux 6.18 on ext4, the 2-core machine of ``docs/benchmarks.md``) one ``write`` of 512 KiB or
more now and then runs at 60-500 MB/s, the kernel's time all in that copy
(``copy_folio_from_iter_atomic``), where writes of 256 KiB run at 3.6-4.2 GB/s: a cache that
wrote an 8 MiB part in one call filled at disk speed what the page cache takes at memory
speed. Writing in pieces costs a syscall per 256 KiB elsewhere (boto3 writes downloads in
pieces of the same size), so the cache's copies and the checkpoint's shards always do.
"""

from __future__ import annotations

import io
import os
from typing import Any

__all__ = ["PIECE", "PiecewiseFileIO", "open_piecewise"]

PIECE = 256 << 10


class PiecewiseFileIO(io.FileIO):
    """``io.FileIO`` that splits a large write into :data:`PIECE`-byte ``write`` calls."""

    def write(self, b: Any, /) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            written = super().write(view[done : done + PIECE])
            if not written:  # a non-blocking descriptor that is full: what went, as FileIO does
                return done
            done += written
        return done


def open_piecewise(file: str | os.PathLike[str] | int, mode: str = "wb") -> io.BufferedWriter:
    """A binary file open for writing (``mode`` ``"wb"``, ``"xb"`` or ``"ab"``; a descriptor
    is owned and closed by the file) whose writes reach the kernel in pieces."""
    if "r" in mode or "+" in mode or "b" not in mode:
        raise ValueError(f"open_piecewise opens binary files for writing only, not {mode!r}")
    target = file if isinstance(file, int) else os.fspath(file)
    return io.BufferedWriter(PiecewiseFileIO(target, mode.replace("b", "")), PIECE)
