"""The files a killed checkpoint save leaves behind: shards staged beside their final names
and shards staged for upload, each named after the pid of the process that staged it, so that
a later save deletes only those of processes that no longer exist."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

TORN = re.compile(r"\..+?\.(?:(\d+)\.)?[0-9a-f]{8}\.part")
"""A shard staged beside its final name (``create_stream``, local destinations), named after
the pid of the process that staged it (none in the names of older versions)."""
STAGED = re.compile(r"dcp-(\d+)-[0-9a-f]{16}\.part")
"""A shard staged for upload, named after the pid of the process that staged it."""


def drop_torn(folder: Path) -> None:
    """Delete the shards dead writers staged beside their final names in ``folder``."""
    _unlink_matching(folder, TORN, lambda m: m[1] is None or not _alive(int(m[1])))


def drop_staged(folder: Path) -> None:
    """Delete the shards dead processes staged for upload in ``folder``."""
    _unlink_matching(folder, STAGED, lambda m: not _alive(int(m.group(1))))


def _unlink_matching(
    folder: Path,
    pattern: re.Pattern[str],
    stale: Callable[[re.Match[str]], bool] = lambda match: True,
) -> None:
    try:
        entries = list(os.scandir(folder))
    except OSError:  # not there yet: nothing was left
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and stale(match):
            with suppress(OSError):  # another user's file in a shared temp dir, or gone
                os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
