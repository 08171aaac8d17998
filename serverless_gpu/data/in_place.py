"""Reading a local volume where it lies, without a copy into the cache.

A volume on the cache's own file system gains nothing from a copy: the bytes come off the same
disk either way, and the copy doubles the space they take. Such a volume is read in place (see
``VolumeDataset(in_place=...)``). The disk still reads ahead: the kernel is asked for the files
the loop will want next (``POSIX_FADV_WILLNEED``) while it works on the current one, which takes
no thread, and only for files whose bytes are not in memory already.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from serverless_gpu.data.errors import VolumeReadError, changed_since_listing

__all__ = ["on_same_file_system", "read_in_place"]

T = TypeVar("T")


def on_same_file_system(volume: str, cache_dir: str | os.PathLike[str]) -> bool:
    """True when ``volume`` lies on the file system that holds (or will hold) ``cache_dir``."""
    try:
        return os.stat(volume).st_dev == os.stat(_existing(Path(cache_dir))).st_dev
    except OSError:
        return False


def _existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists (the cache folder is made on first use)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return path


_WARM_RUN = 64
"""Files in a row found in memory after which a pass stops asking (the rest is likely too)."""


def read_in_place(
    paths: Sequence[str],
    sizes: Sequence[int],
    ahead: int,
    transform: Callable[[str], T] | None = None,
) -> Iterator[str | T]:
    """Every local path of ``paths`` in order (or ``transform(path)``), the disk reading the
    next ``ahead`` files meanwhile.

    A path handed out is checked first against its listed size (``sizes``): a file deleted or
    rewritten since the listing is a ``VolumeReadError`` naming it, never a silent skip. With a
    ``transform`` the file is checked only when the transform fails (it opens the file anyway;
    a stat per file would be a tenth of the time of reading a 256 KiB one from memory): a file
    gone or resized is then the ``VolumeReadError``, and one rewritten to a new size that the
    transform reads without error is read as it is now.
    """
    in_memory = 0
    for k in range(min(ahead, len(paths))):
        in_memory = in_memory + 1 if _read_ahead(paths[k]) else 0
    end = len(paths)
    for k, path in enumerate(paths):
        later = k + ahead
        if ahead > 0 and later < end and in_memory < _WARM_RUN:
            in_memory = in_memory + 1 if _read_ahead(paths[later]) else 0
        if transform is None:
            yield _checked(path, sizes[k])
            continue
        try:
            item = transform(path)
        except Exception as exc:  # a vanished or truncated file fails in many ways
            _checked(path, sizes[k], cause=exc)
            raise
        yield item


def _checked(path: str, size: int, cause: BaseException | None = None) -> str:
    """``path`` when it is still there with the listed size; else a ``VolumeReadError`` naming
    it (raised from ``cause``, the transform's error, when there is one)."""
    try:
        now = os.stat(path).st_size
    except OSError as exc:
        raise VolumeReadError(f"cannot read {path}: {exc}") from (cause or exc)
    if now != size:
        raise changed_since_listing(path, now, size) from cause
    return path


def _read_ahead(path: str) -> bool:
    """Ask the disk for ``path`` unless its bytes are in memory already; True when they are.
    Asking whether they are costs a microsecond, asking the disk for cached bytes several."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False  # its own turn reports it
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        return True
    except (OSError, AttributeError):  # BlockingIOError: on disk; others: cannot tell
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # a hint only; file systems without it read on demand
        return False
    finally:
        os.close(fd)
