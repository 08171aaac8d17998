"""The caller's side of starting a run that the operating system refused: a full disk, a
deleted working directory, as the library's own errors saying what to do."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from serverless_gpu.common.errors import ConfigurationError, DistributedError, StorageError
from serverless_gpu.runfiles.rundirs import storage_hint

_STORAGE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO}


def os_error(
    what: str,
    exc: OSError,
    other: type[DistributedError],
    folder: Path,
    run_dir: Path | None = None,
) -> DistributedError:
    """An OSError on the way to starting a run, as the library's own error: a
    :class:`StorageError` saying what to do about ``folder`` when a disk refused a write,
    else ``other``."""
    if isinstance(exc, DistributedError):
        return exc
    if exc.errno in _STORAGE_ERRNOS:
        err: DistributedError = StorageError.wrap(what, exc, storage_hint(folder, exc.errno))
    else:
        err = other(f"{what}: {exc}")
    err.run_dir = run_dir
    return err


def working_directory() -> str:
    """The caller's working directory, where the ranks start."""
    try:
        return os.getcwd()
    except OSError as exc:
        raise ConfigurationError(
            f"the current working directory cannot be read ({exc.strerror}; was it deleted?): "
            "the ranks start in it. Change to an existing directory (os.chdir) and call again."
        ) from None
