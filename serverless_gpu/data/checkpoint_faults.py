"""What went wrong with a checkpoint's files, said as the cause, the path and the way out
(instead of the message of whatever layer happened to notice first)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["damaged_metadata", "explained"]

_FULL = (errno.ENOSPC, errno.EDQUOT)
_NEARLY_FULL = 1 << 20
"""Less free space than this where a write just failed: the write failed for want of it (torch's
zip writer reports a short write as "unexpected pos", without the errno)."""


def explained(exc: BaseException, staged: Path, path: str | os.PathLike[str]) -> OSError | None:
    """A clearer error for ``exc``, raised while the shard ``path`` was staged at ``staged``,
    or ``None`` when there is nothing to add."""
    checkpoint = os.fspath(path).rstrip("/").rsplit("/", 1)[0]
    if _disk_full(exc, staged.parent):
        mount = _mount_of(staged.parent)
        return OSError(
            errno.ENOSPC,
            f"no space left on {mount} (the file system of {staged.parent}) while saving "
            f"{os.fspath(path)}: this checkpoint was not published ({checkpoint} has no "
            ".metadata, so nothing will load it) and the steps saved before it are intact. "
            f"Free space on {mount}, or save to a folder with more room",
        )
    if isinstance(exc, FileNotFoundError) and not staged.exists():
        return FileNotFoundError(
            errno.ENOENT,
            f"the partial shard {staged} of this save was deleted while it was written: "
            f"another save into {checkpoint} ran at the same time (two writers of one step, "
            "each removing what it takes for the leftovers of a killed save). Give each save "
            "its own folder (checkpoint_path(root, step))",
        )
    return None


def damaged_metadata(path: str, size: int, exc: BaseException) -> str:
    """The message for a ``.metadata`` that exists but cannot be read."""
    return (
        f"{path} is damaged ({size} bytes that cannot be read: {exc}): the save that wrote it "
        "did not finish writing it, or it was cut short since. Load an earlier step "
        "(latest_checkpoint passes over damaged ones)"
    )


def _disk_full(exc: BaseException, folder: Path) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _NEARLY_FULL


def _mount_of(folder: Path) -> str:
    path = folder.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return str(path)
