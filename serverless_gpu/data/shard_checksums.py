"""A checksum per checkpoint shard: recorded when it is saved, checked when it is loaded.

torch's reader has none: flipped bytes in a shard load "successfully" as wrong values. Each
shard's ``zlib.crc32`` (the fastest checksum the standard library has: no dependency, 2 GB/s
and more a core) and size are computed while it is written, by a thread that reads back what
the writer put in the page cache, trailing it, so the sum costs no time on the writer's path
(``benchmarks/checkpoint.py`` measures it beside the save and load figures). They travel in
``.metadata``, as one more attribute of each item's storage record (``shard_crc32``: a
plain tuple, which torch's own reader unpickles and ignores); a shard saved without one (an
older save, torch's writer) is not checked.
"""

from __future__ import annotations

import os
import threading
import zlib
from typing import IO, Any

__all__ = ["ATTR", "TrailingCrc", "crc32_of"]

ATTR = "shard_crc32"
"""The attribute of an item's ``_StorageInfo`` holding its shard's ``(size, crc32)``."""
_BLOCK = 8 << 20


class TrailingCrc:
    """The crc32 of a file being written at ``path``, summed by a thread that reads what
    :meth:`wrote` reports written (from the page cache) while the writer goes on. The file
    is opened at the first report (made before it, this may come before the file)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = path
        self._fd = -1
        self._written = 0
        self._summed = 0
        self._crc = 0
        self._closed = False
        self._error: BaseException | None = None
        self._moved = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="shard-crc32", daemon=True)
        self._thread.start()

    def wrote(self, end: int) -> None:
        """The file now holds ``end`` bytes."""
        with self._moved:
            self._written = end
            self._moved.notify()

    def result(self, size: int) -> tuple[int, int]:
        """``(size, crc32)`` once every byte up to ``size`` (the file's final size) is summed."""
        self.wrote(size)
        self.close()
        if self._error is not None:
            raise self._error
        return size, self._crc

    def close(self) -> None:
        with self._moved:
            self._closed = True
            self._moved.notify()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        view = memoryview(bytearray(_BLOCK))
        try:
            while (end := self._next_end()) is not None:
                if self._fd < 0:
                    self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
                while self._summed < end:
                    part = view[: min(_BLOCK, end - self._summed)]
                    got = os.preadv(self._fd, [part], self._summed)
                    if got == 0:
                        raise EOFError(f"the shard ended at {self._summed} of {end} bytes")
                    self._crc = zlib.crc32(view[:got], self._crc)
                    self._summed += got
        except BaseException as exc:  # reported by result()
            self._error = exc

    def _next_end(self) -> int | None:
        """Wait for bytes not summed yet: where they end, or None once closed and done."""
        with self._moved:
            while self._summed >= self._written and not self._closed:
                self._moved.wait()
            return self._written if self._summed < self._written else None


def crc32_of(stream: IO[bytes]) -> tuple[int, int]:
    """``(size, crc32)`` of what ``stream`` holds from its position to its end."""
    buffer = bytearray(_BLOCK)
    view = memoryview(buffer)
    crc = size = 0
    while got := stream.readinto(view):  # type: ignore[attr-defined]
        crc = zlib.crc32(view[:got], crc)
        size += got
    return size, crc


def recorded(info: Any) -> tuple[int, int] | None:
    """The ``(size, crc32)`` recorded for the shard of an item's storage record, if any."""
    value = getattr(info, ATTR, None)
    return (int(value[0]), int(value[1])) if isinstance(value, tuple) and len(value) == 2 else None


class ReadCrc:
    """The crc32 of a shard summed from the bytes a load reads anyway, as they pass, in offset
    order: what the load skips (an archive's header, an item left to torch's reader, parts
    of the shard another rank loads) is read for the sum through ``read_at``. So a load
    checks its shards without a second pass over them."""

    def __init__(self, read_at: Any) -> None:
        self._read_at = read_at
        """``read_at(view, offset) -> bytes read``: fills ``view`` from ``offset``."""
        self.at = 0
        self.crc = 0

    def feed(self, start: int, data: memoryview) -> None:
        """The bytes from ``start`` that the load just read."""
        end = start + len(data)
        if end <= self.at:
            return
        if start > self.at:
            self._catch_up(start)
        self.crc = zlib.crc32(data[self.at - start :], self.crc)
        self.at = end

    def finish(self, size: int) -> tuple[int, int]:
        """``(size, crc32)`` of the whole shard of ``size`` bytes."""
        self._catch_up(size)
        return self.at, self.crc

    def _catch_up(self, end: int) -> None:
        view = memoryview(bytearray(min(_BLOCK, max(end - self.at, 1))))
        while self.at < end:
            got = self._read_at(view[: min(len(view), end - self.at)], self.at)
            if not got:
                return  # shorter than it should be: the sizes differ, which says so
            self.crc = zlib.crc32(view[:got], self.crc)
            self.at += got
