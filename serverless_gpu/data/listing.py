"""List the files of a volume directory in a deterministic order."""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from typing import Any, BinaryIO

from serverless_gpu.data._fs import is_local, join, request_bounds, resolve
from serverless_gpu.data.errors import (
    EmptyVolumeError,
    VolumeNotFoundError,
    VolumeReadError,
    changed_since_listing,
)

__all__ = ["VolumeFile", "copy_file", "list_volume"]

_COPY_CHUNK = 4 << 20
_ONE_REQUEST = 16 << 20
"""Remote files up to this size are read with one ranged request, held in memory."""
_PART = 8 << 20
_PARTS_AT_ONCE = 4
"""Larger remote files come in ranged requests of ``_PART`` bytes, this many at once: one
connection to an object store moves tens of MB/s (a moto server on two cores, or S3 itself)."""


@dataclass(frozen=True)
class VolumeFile:
    """One file of a volume: its path relative to the volume root, its size in bytes and
    what the store says identifies this content (ETag, generation, mtime: ``version``)."""

    relpath: str
    size: int
    version: str = ""


def list_volume(
    url: str | os.PathLike[str],
    *,
    recursive: bool = False,
    glob: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[VolumeFile]:
    """Return the files under ``url`` sorted by relative path.

    ``glob`` is matched with :func:`fnmatch.fnmatchcase` against the path relative to the volume
    root (``*`` also crosses ``/``, so ``"*.bin"`` matches nested files of a recursive listing).
    Hidden files (a path segment starting with ``.``) are skipped.

    Raises:
        VolumeNotFoundError: ``url`` does not exist or is not a directory.
        EmptyVolumeError: nothing matched.
        VolumeReadError: the listing itself failed (permissions, network).
    """
    if not os.fspath(url).strip():
        # fsspec reads "" as the working directory: a dataset of whatever is there.
        raise VolumeNotFoundError(
            f"the volume path is empty ({os.fspath(url)!r}); pass the directory or URL to read"
        )
    fs, root = resolve(url, storage_options)
    try:
        fs.invalidate_cache(root)
        if not fs.isdir(root):
            raise VolumeNotFoundError(
                f"volume {os.fspath(url)!r} does not exist or is not a directory"
            )
        if recursive:
            entries = fs.find(root, detail=True)
        else:
            entries = {e["name"]: e for e in fs.ls(root, detail=True)}
    except FileNotFoundError as exc:
        raise VolumeNotFoundError(f"volume {os.fspath(url)!r} does not exist") from exc
    except OSError as exc:
        raise VolumeReadError(
            f"cannot list volume {os.fspath(url)!r}: {exc}{_bounds_note(fs)}"
        ) from exc

    files = _files_of(entries, root, glob)
    if not files:
        detail = f" matching {glob!r}" if glob else ""
        raise EmptyVolumeError(f"volume {os.fspath(url)!r} has no files{detail}")
    files.sort(key=lambda f: f.relpath)
    return files


def _files_of(entries: dict[str, Any], root: str, glob: str | None) -> list[VolumeFile]:
    files = []
    prefix = root.rstrip("/") + "/"
    for name, info in entries.items():
        if info.get("type") != "file":
            continue
        relpath = name[len(prefix) :] if name.startswith(prefix) else name.rsplit("/", 1)[-1]
        if any(part.startswith(".") for part in relpath.split("/")):
            continue
        if glob is not None and not fnmatch.fnmatchcase(relpath, glob):
            continue
        size = int(info.get("size") or 0)
        files.append(VolumeFile(relpath=relpath, size=size, version=_version(info)))
    return files


_VERSION_KEYS = ("ETag", "etag", "generation", "VersionId", "version_id", "mtime", "LastModified")
"""What fsspec's stores report that changes with a file's content (S3, GCS, Azure, local)."""


def _version(info: dict[str, Any]) -> str:
    return ";".join(f"{key}={info[key]}" for key in _VERSION_KEYS if info.get(key) is not None)


def copy_file(
    url: str | os.PathLike[str],
    relpath: str,
    out: BinaryIO,
    *,
    storage_options: dict[str, Any] | None = None,
    max_bytes: int | None = None,
) -> None:
    """Copy the volume file ``relpath`` into ``out``; failures become :class:`VolumeReadError`.

    With ``max_bytes``, a file longer than that is an error as soon as the copy passes it (a
    file that grew after the listing must not fill the cache's disk).
    """
    fs, root = resolve(url, storage_options)
    source = join(root, relpath)
    try:
        if max_bytes is not None and max_bytes > 0 and not is_local(fs):
            # fs.open asks an object store for the size first (a HEAD) unless this process
            # listed the volume itself, and a DataLoader worker did not: ranged GETs of the
            # listed size, the last one a byte past it so that a file which grew is noticed.
            _copy_in_parts(fs, source, out, max_bytes)
            return
        with fs.open(source, "rb") as src:
            _copy_at_most(src, out, max_bytes)
    except _TooLong:
        raise VolumeReadError(
            f"{fs.unstrip_protocol(source)} is longer than the {max_bytes} bytes the volume "
            "listed: the file changed after the dataset listed the volume; make the dataset "
            "again to list it anew"
        ) from None
    except OSError as exc:
        raise VolumeReadError(
            f"cannot read {fs.unstrip_protocol(source)}: {exc}{_bounds_note(fs)}"
        ) from exc


class _TooLong(Exception):
    pass


def _copy_in_parts(fs: Any, source: str, out: BinaryIO, size: int) -> None:
    """The ``size`` listed bytes of the remote ``source`` into ``out``: one request up to
    ``_ONE_REQUEST`` bytes, else ``_PART``-byte ranges, ``_PARTS_AT_ONCE`` at a time."""
    part = size if size <= _ONE_REQUEST else _PART
    starts = list(range(0, size, part))
    for first in range(0, len(starts), _PARTS_AT_ONCE):
        window = starts[first : first + _PARTS_AT_ONCE]
        ends = [min(start + part, size) for start in window]
        last = ends[-1] == size
        asked = [*ends[:-1], size + 1] if last else ends
        if len(window) == 1:
            parts = [fs.cat_file(source, start=window[0], end=asked[0])]
        else:
            parts = fs.cat_ranges([source] * len(window), window, asked, on_error="raise")
        for start, end, data in zip(window, ends, parts, strict=True):
            if len(data) > end - start:
                raise _TooLong
            if len(data) < end - start:
                name = fs.unstrip_protocol(source)
                raise changed_since_listing(name, start + len(data), size)
            out.write(data)


def _copy_at_most(src: BinaryIO, out: BinaryIO, max_bytes: int | None) -> None:
    if max_bytes is None:
        shutil.copyfileobj(src, out, _COPY_CHUNK)
        return
    left = max_bytes
    while chunk := src.read(min(_COPY_CHUNK, left + 1)):
        if len(chunk) > left:
            raise _TooLong
        out.write(chunk)
        left -= len(chunk)


def _bounds_note(fs: Any) -> str:
    """For an object store: the request bounds the error came after."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return f" (after {request_bounds()})" if "s3" in protocols else ""
