"""Folders of ours that another local user must not be able to plant, read or redirect.

A folder in a place every user can write to (``/tmp``, ``/dev/shm``, or a ``cache_dir`` made
with ``mkdir -m 1777``) may have been put there first by someone else: a symlink to a folder
they chose, or a folder of theirs in which they plant files of the right name. Each check
here refuses such a folder with a :class:`PrivateDirError` that names the folder, the reason
and what to do; nothing is followed, chmod'ed or deleted through it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from serverless_gpu.common.errors import ConfigurationError

__all__ = [
    "PrivateDirError",
    "default_private_dir",
    "not_planted",
    "private_dir",
    "private_subdir",
]


class PrivateDirError(ConfigurationError):
    """A folder of ours is not safe to use (a symlink, another user's, open to others)."""


def default_private_dir(
    root: Path, setting: str, what: str, error: type[PrivateDirError] = PrivateDirError
) -> Path:
    """``root`` in a folder all users share: made ``0700`` by us, or refused unless it is a
    directory (not a link) of ours with mode exactly ``0700``."""
    try:
        os.mkdir(root, 0o700)
        created = True
    except FileExistsError:
        created = False
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise error(
            f"{root} is a symlink or not a directory: serverless_gpu did not make it, and "
            f"another user may have planted it to redirect your {what}. Set {setting} to a "
            "private folder of yours, or have it removed (by its owner or an administrator)"
        ) from exc
    try:
        st = os.fstat(fd)
        _check_owner(root, st, setting, what, error)
        if created:
            os.fchmod(fd, 0o700)  # whatever the umask
        elif stat.S_IMODE(st.st_mode) != 0o700:
            raise error(
                f"{root} has mode {stat.S_IMODE(st.st_mode):o}, not 700: other users may reach "
                f"your {what}. Run `chmod 700 {root}` if you made it, or set {setting}"
            )
    finally:
        os.close(fd)
    return root


def private_dir(
    root: Path, setting: str, what: str, error: type[PrivateDirError] = PrivateDirError
) -> Path:
    """A folder the user named (``setting``): it may be a symlink of theirs, but what it leads
    to must be a directory of ours that other users cannot write to. Made ``0700`` when
    missing; an existing one keeps its mode."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(root, 0o700)
        created = True
    except FileExistsError:
        created = False
    except OSError as exc:
        raise error(f"cannot create {setting}={root} ({exc.strerror})") from exc
    try:
        st = os.stat(root)  # a link the user chose is followed; what it leads to is checked
    except OSError as exc:
        raise error(f"cannot use {setting}={root} ({exc.strerror})") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{setting}={root} is not a directory")
    _check_owner(root, st, setting, what, error)
    if created:
        os.chmod(root, 0o700)
    elif st.st_mode & stat.S_IWOTH:
        raise error(
            f"{setting}={root} is writable by every user, who could replace your {what}: "
            f"run `chmod o-w {root}` or choose a private folder"
        )
    return root


def private_subdir(root: Path, parts: list[str], setting: str, what: str) -> Path:
    """``root/part/part/...``, each folder made ``0700`` when missing and otherwise required to
    be a real directory (never a symlink) of ours: nothing below a root we checked is
    followed elsewhere."""
    folder = root
    for part in parts:
        folder = folder / part
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise PrivateDirError(
                f"{folder} is {kind}: serverless_gpu did not make it, and it may redirect "
                f"your {what} elsewhere. Remove it, or set {setting} to a private folder"
            )
        _check_owner(folder, st, setting, what, PrivateDirError)
    return folder


def not_planted(folder: Path, setting: str, what: str) -> None:
    """A folder we are about to write into, which the user named but which may sit in a place
    others can write to: refused when it, or a link at its place, is another user's (their
    link or folder would receive our files). A folder that does not exist yet passes."""
    try:
        st = os.lstat(folder)
        reached = os.stat(folder) if stat.S_ISLNK(st.st_mode) else st
    except FileNotFoundError:  # not made yet, or a dangling link: made or refused by mkdir
        return
    _check_owner(folder, st, setting, what, PrivateDirError)
    _check_owner(folder, reached, setting, what, PrivateDirError)


def _check_owner(
    root: Path, st: os.stat_result, setting: str, what: str, error: type[PrivateDirError]
) -> None:
    if st.st_uid != os.getuid():
        raise error(
            f"{root} belongs to user id {st.st_uid}, not to you (user id {os.getuid()}): "
            f"another user may have made it to read or redirect your {what}. "
            f"Set {setting} to a private folder of yours"
        )
