"""A result file's pages reserved ahead of the stores into its mapping, in a thread of its own.

Reserving (``posix_fallocate``) is what makes a full tmpfs an ``ENOSPC`` instead of a SIGBUS
at the first store into the mapping, and it is not cheap: the kernel zeroes every page in the
one calling thread, with the file's inode locked (about 0.2 s a GiB on an H200 machine's
host). The stores into reserved pages run in torch's threads. Reserving chunk by chunk in the
background while the writer stores into the chunks reserved already overlaps the two, so a
result costs about its reservation and no more.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

CHUNK_BYTES = 32 << 20
_DEADLINE_S = 60.0
_SLOWEST_BYTES_PER_S = 50e6
"""A wait's limit: _DEADLINE_S plus the bytes waited for at this rate, far beyond any working
reservation or copy."""


def deadline(nbytes: int) -> float:
    """The ``time.monotonic()`` by which work on ``nbytes`` bytes has surely ended or hung."""
    return time.monotonic() + _DEADLINE_S + nbytes / _SLOWEST_BYTES_PER_S


def pieces(offset: int, src: Any) -> Iterator[tuple[int, Any]]:
    """``(offset, slice)`` of the 1-D byte tensor ``src`` stored at ``offset``, a chunk at a
    time: each can be stored once its chunk is reserved."""
    for at in range(0, src.numel(), CHUNK_BYTES):
        yield offset + at, src[at : at + CHUNK_BYTES]


class Reservation:
    """Reserves ``[0, nbytes)`` of the open file ``fd``: the first chunk at once (so that
    :attr:`supported` is known), the others in order in a thread. :meth:`wait` blocks until a
    range is reserved. Leaving the ``with`` block stops the thread and joins it."""

    def __init__(self, fd: int, nbytes: int) -> None:
        self._nbytes = nbytes
        self._error: OSError | None = None
        self._stop = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.reserved = min(nbytes, CHUNK_BYTES)
        self.supported = _fallocate(fd, 0, self.reserved)
        """False where the filesystem cannot reserve space at all (nothing else was done)."""
        if self.supported and self.reserved < nbytes:
            # The thread's own descriptor: the writer may close its file before a stuck
            # reservation ends, and the number may then name another file.
            own = os.dup(fd)
            self._thread = threading.Thread(
                target=self._run, args=(own,), name="sgpu-reserve", daemon=True
            )
            self._thread.start()

    def _run(self, fd: int) -> None:
        offset = self.reserved
        try:
            while offset < self._nbytes and not self._stop:
                size = min(CHUNK_BYTES, self._nbytes - offset)
                try:
                    os.posix_fallocate(fd, offset, size)
                except OSError as exc:
                    error: OSError | None = exc
                else:
                    error, offset = None, offset + size
                with self._changed:
                    self._error, self.reserved = error, offset
                    self._changed.notify_all()
                if error is not None:
                    return
        finally:
            os.close(fd)

    def wait(self, end: int) -> None:
        """Return once ``[0, end)`` is reserved; raise the reservation's error (``ENOSPC``)
        instead where it failed before ``end``."""
        limit = deadline(end)
        with self._changed:
            while self.reserved < end and self._error is None:
                left = limit - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"reserving {end} bytes of a result file took too long")
                self._changed.wait(left)
            if self.reserved < end and self._error is not None:
                raise OSError(self._error.errno, self._error.strerror)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(max(0.0, deadline(CHUNK_BYTES) - time.monotonic()))


def _fallocate(fd: int, offset: int, size: int) -> bool:
    """Reserve ``size`` bytes at ``offset``; False where the filesystem cannot reserve space
    at all. A full filesystem raises."""
    try:
        os.posix_fallocate(fd, offset, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        return False
    return True
