"""Resolve volume URLs to fsspec filesystems, one instance per process."""

from __future__ import annotations

import os
import posixpath
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

__all__ = ["is_local", "join", "mtime_of", "resolve"]

# fsspec filesystems hold event loops and connection pools that must not cross fork(), so
# instances are cached per pid and never pickled with the objects that use them.
_CACHE: dict[tuple[int, str, str], tuple[fsspec.AbstractFileSystem, str]] = {}


def resolve(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return ``(filesystem, path-inside-filesystem)`` for a local path or fsspec URL."""
    text = os.fspath(url)
    options = dict(storage_options or {})
    key = (os.getpid(), text, repr(sorted(options.items())))
    hit = _CACHE.get(key)
    if hit is None:
        fs, path = url_to_fs(text, **options)
        hit = (fs, path.rstrip("/") or "/")
        _CACHE[key] = hit
    return hit


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True when ``fs`` is the machine's own file system (where ``os.replace`` is atomic)."""
    return isinstance(fs, LocalFileSystem)


def join(base: str, *parts: str) -> str:
    """Join path segments inside a filesystem (always ``/``-separated, like fsspec)."""
    return posixpath.join(base, *parts)


def mtime_of(info: dict[str, Any]) -> float:
    """Best-effort modification time (seconds since epoch) from an fsspec ``info`` dict."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return 0.0
