"""Resolve volume URLs to fsspec filesystems, one instance per process."""

from __future__ import annotations

import os
import posixpath
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from serverless_gpu.common import settings

__all__ = ["is_local", "join", "mtime_of", "request_bounds", "resolve"]

# fsspec filesystems hold event loops and connection pools that must not cross fork(), so
# instances are cached per pid and never pickled with the objects that use them.
_CACHE: dict[tuple[int, str, str], tuple[fsspec.AbstractFileSystem, str]] = {}


def resolve(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return ``(filesystem, path-inside-filesystem)`` for a local path or fsspec URL."""
    text = os.fspath(url)
    options = dict(storage_options or {})
    s3 = text.startswith(("s3://", "s3a://"))
    if s3:
        options = _s3_bounds(options)
    tries = settings.VOLUME_TRIES.read()
    key = (os.getpid(), text, repr((sorted(options.items()), tries)))
    hit = _CACHE.get(key)
    if hit is None:
        fs, path = url_to_fs(text, **options)
        if s3:
            # s3fs retries timeouts itself, with backoff, around botocore's attempts; with one
            # owner of the count (botocore makes one attempt) the bound is what it says.
            fs.retries = tries
        hit = (fs, path.rstrip("/") or "/")
        _CACHE[key] = hit
    return hit


def request_bounds() -> str:
    """The object-store request bounds in words, for an error that ran into them."""
    tries = settings.VOLUME_TRIES.read()
    timeout = settings.VOLUME_TIMEOUT.read()
    return (
        f"{tries} tries, each waiting at most {timeout:g} s for the server "
        f"({settings.VOLUME_TRIES.name}, {settings.VOLUME_TIMEOUT.name})"
    )


def _s3_bounds(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with timeouts and a count of tries: without them a server that accepts
    connections and stops answering holds a read for s3fs's 5 tries x botocore's 5 attempts
    x 15 s. A value the caller gave wins."""
    timeout = settings.VOLUME_TIMEOUT.read()
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", timeout)
    config.setdefault("read_timeout", timeout)
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    return {**options, "config_kwargs": config}


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
