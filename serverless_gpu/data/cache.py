"""A node-local file cache shared safely by every process of the machine.

* No torn files: a download goes to a hidden temp name in the target's directory and is
  published with ``os.replace``; a per-file ``flock`` makes concurrent fetches of one file
  download it once (and a lost race would still be harmless).
* Free-disk floor: before a download, under a cache-wide ``flock``, least-recently-used files
  are evicted until ``free - size >= min_free_bytes``; the temp file is then preallocated so
  other processes see the space as taken while the download runs.
* Trust: the cache folder must be ours and not writable by other users (a shared one made with
  ``mkdir -m 1777`` is refused), no folder below it may be a symlink, and a cached file is
  reused only when we wrote it (our uid, a regular file) and it matches what the source said
  when it was fetched: its size and its ``version`` (ETag, generation or mtime) are part of
  the path the copy is published at.
* Pins: a reader holds a shared ``flock`` on a cached file; eviction only removes files it can
  lock exclusively without waiting, so files in use are never deleted under a reader.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from hashlib import sha1
from pathlib import Path
from typing import BinaryIO

from serverless_gpu.common import settings
from serverless_gpu.data.errors import CacheFullError, VolumeReadError, changed_since_listing
from serverless_gpu.data.piecewise import open_piecewise
from serverless_gpu.runfiles.private_dirs import PrivateDirError, private_dir, private_subdir

__all__ = ["CachePin", "LocalCache", "boot_id", "default_cache_dir"]

_LOCKS = ".locks"
_SETTING = "cache_dir"
_WHAT = "cached files"
_REFUSED = "refusing to use it as a cached copy (remove it, or choose a private cache_dir)"
_TRIES = 5


def default_cache_dir() -> Path:
    """``$SERVERLESS_GPU_CACHE_DIR`` or ``~/.cache/serverless_gpu/volumes``."""
    env = settings.CACHE_DIR.read()
    return Path(env) if env else Path.home() / ".cache" / "serverless_gpu" / "volumes"


class CachePin:
    """An open, share-locked cached file; it cannot be evicted until :meth:`close`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def fileno(self) -> int:
        """The pinned file's descriptor, open for reading."""
        if self._fd is None:
            raise ValueError("the pin is closed")
        return self._fd

    def close(self) -> None:
        """Release the pin."""
        if self._fd is not None:
            _unlock_and_close(self._fd)
            self._fd = None

    def __enter__(self) -> CachePin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalCache:
    """Files cached under ``cache_dir/namespace/<relpath>`` (see the module docstring).

    Locks and eviction span the whole ``cache_dir``, so volumes sharing it (one namespace
    each) also share the free-disk floor and evict each other's least recently used files.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        *,
        namespace: str = "",
        min_free_bytes: int = 0,
        durable: bool = True,
    ) -> None:
        self.root = private_dir(Path(cache_dir), "cache_dir", "cached files")
        self.namespace = namespace
        self.min_free_bytes = int(min_free_bytes)
        self.durable = durable
        """Whether a download is fsynced before it is published. Without, a kernel crash or
        power loss may leave a published file's blocks unwritten: zeros of the right size,
        since the temp file was preallocated. A caller that turns it off must not trust files
        from an earlier boot (VolumeDataset's namespace includes :func:`boot_id`)."""
        private_subdir(self.root, [_LOCKS], _SETTING, _WHAT)

    def acquire(
        self,
        relpath: str,
        size: int,
        download: Callable[[BinaryIO], None],
        *,
        version: str = "",
    ) -> CachePin:
        """Return a pin on the cached copy of ``relpath``, downloading it first if needed.

        ``download`` writes the file's bytes into the given binary file. A cached copy is
        reused when it was fetched for the same ``size`` and ``version`` (what the source
        says identifies this content: an ETag, a generation, an mtime).
        """
        target = self._target(relpath, size, version)
        for _ in range(_TRIES):
            pin = self._try_pin(target, size)
            if pin is not None:
                return pin
            with self._flock(self._lock_path(relpath)):
                # Another process may have fetched it while this one waited for the lock.
                pin = self._try_pin(target, size)
                if pin is not None:
                    return pin
                self._download(target, size, download)
        raise CacheFullError(
            f"{relpath!r} was evicted again right after download {_TRIES} times; the cache "
            f"under {self.root} is too small for the files in use (min_free_bytes="
            f"{self.min_free_bytes})"
        )

    def _target(self, relpath: str, size: int, version: str) -> Path:
        parts = [p for p in self.namespace.split("/") if p] + relpath.split("/")
        if not relpath or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise VolumeReadError(f"refusing to cache unsafe relative path {relpath!r}")
        # What the source said at fill time is recorded in the path: a copy fetched for
        # another size or version of the file is never found, only evicted in time.
        source = sha1(f"{size}\0{version}".encode()).hexdigest()[:12]
        parts.insert(len(parts) - 1, f"v{source}")
        return self.root.joinpath(*parts)

    def _lock_path(self, relpath: str) -> Path:
        key = f"{self.namespace}\0{relpath}".encode()
        return self.root / _LOCKS / (sha1(key).hexdigest() + ".lock")

    @staticmethod
    @contextmanager
    def _flock(path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            _unlock_and_close(fd)

    def _try_pin(self, target: Path, size: int) -> CachePin | None:
        try:
            self._check_folders(target.parent)
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise PrivateDirError(f"{target} is a symlink: {_REFUSED}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise PrivateDirError(f"{target} was not written by you: {_REFUSED}")
            # An evictor may have unlinked (or a downloader replaced) the name before the lock.
            if st.st_size != size or os.lstat(target).st_ino != st.st_ino:
                _unlock_and_close(fd)
                return None
        except FileNotFoundError:
            _unlock_and_close(fd)
            return None
        except BaseException:
            _unlock_and_close(fd)
            raise
        os.utime(target)  # mtime is the LRU clock
        return CachePin(target, fd)

    def _check_folders(self, folder: Path) -> None:
        """Every folder from the root down to ``folder`` is a real one of ours (no symlink)."""
        if folder.is_relative_to(self.root) and os.path.lexists(folder):
            private_subdir(self.root, list(folder.relative_to(self.root).parts), _SETTING, _WHAT)

    def _download(self, target: Path, size: int, download: Callable[[BinaryIO], None]) -> None:
        private_subdir(self.root, list(target.parent.relative_to(self.root).parts), _SETTING, _WHAT)
        tmp = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with self._flock(self.root / _LOCKS / "evict.lock"):
            self._make_room(size)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                _reserve(fd, size)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
        try:
            with open_piecewise(fd, write_behind=self.durable) as out:
                download(out)
                out.truncate()
                out.flush()
                if self.durable:
                    os.fsync(out.fileno())
                written = out.tell()
            if written != size:
                raise changed_since_listing(target.name, written, size)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheFullError(f"disk full while caching {target}: {exc}") from exc
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def free_bytes(self) -> int:
        """Free bytes (for unprivileged users) on the cache's file system."""
        return shutil.disk_usage(self.root).free

    def _make_room(self, size: int) -> None:
        if self.free_bytes() - size >= self.min_free_bytes:
            return
        for path in self._eviction_candidates():
            if _evict(path) and self.free_bytes() - size >= self.min_free_bytes:
                return
        raise CacheFullError(
            f"cannot cache {size} bytes under {self.root}: {self.free_bytes()} bytes free and "
            f"min_free_bytes={self.min_free_bytes}, and every cached file is in use"
        )

    def _eviction_candidates(self) -> list[Path]:
        """Cached files, least recently used first; also removes temp files of dead processes."""
        found: list[tuple[float, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d != _LOCKS]
            for name in filenames:
                path = Path(dirpath) / name
                if name.startswith("."):
                    _remove_orphan_tmp(path)
                    continue
                try:
                    found.append((path.stat().st_mtime, path))
                except FileNotFoundError:
                    continue
        found.sort(key=lambda item: item[0])
        return [path for _, path in found]


def boot_id() -> str:
    """This boot of the machine (Linux's random boot id), or ``""`` where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _unlock_and_close(fd: int) -> None:
    # A flock belongs to the open file, which a process forked meanwhile (a DataLoader starting
    # its workers, say) shares: closing only this descriptor would leave the file locked for as
    # long as the child lives. LOCK_UN releases it for every holder.
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _reserve(fd: int, size: int) -> None:
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CacheFullError(f"no space to reserve {size} bytes in the cache: {exc}") from exc
        # File systems without fallocate: the download still works, only without reservation.
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def _evict(path: Path) -> bool:
    """Delete ``path`` unless a reader pins it; True when it was deleted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # gone, or a symlink (never followed)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino != os.fstat(fd).st_ino:
            return False
        path.unlink()
        return True
    except (BlockingIOError, FileNotFoundError):
        return False
    finally:
        _unlock_and_close(fd)


def _remove_orphan_tmp(path: Path) -> None:
    parts = path.name.split(".")
    # Temp names are ".<name>.<pid>.<token>.tmp"; anything else hidden is left alone.
    if len(parts) < 4 or parts[-1] != "tmp" or not parts[-3].isdigit():
        return
    try:
        os.kill(int(parts[-3]), 0)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
    except PermissionError:
        pass
