"""List the files of a volume directory in a deterministic order."""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from typing import Any, BinaryIO

from serverless_gpu.data._fs import join, resolve
from serverless_gpu.data.errors import EmptyVolumeError, VolumeNotFoundError, VolumeReadError

__all__ = ["VolumeFile", "copy_file", "list_volume"]

_COPY_CHUNK = 4 << 20


@dataclass(frozen=True)
class VolumeFile:
    """One file of a volume: its path relative to the volume root and its size in bytes."""

    relpath: str
    size: int


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
        raise VolumeReadError(f"cannot list volume {os.fspath(url)!r}: {exc}") from exc

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
        files.append(VolumeFile(relpath=relpath, size=int(info.get("size") or 0)))
    if not files:
        detail = f" matching {glob!r}" if glob else ""
        raise EmptyVolumeError(f"volume {os.fspath(url)!r} has no files{detail}")
    files.sort(key=lambda f: f.relpath)
    return files


def copy_file(
    url: str | os.PathLike[str],
    relpath: str,
    out: BinaryIO,
    *,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Copy the volume file ``relpath`` into ``out``; failures become :class:`VolumeReadError`."""
    fs, root = resolve(url, storage_options)
    source = join(root, relpath)
    try:
        with fs.open(source, "rb") as src:
            shutil.copyfileobj(src, out, _COPY_CHUNK)
    except OSError as exc:
        raise VolumeReadError(f"cannot read {fs.unstrip_protocol(source)}: {exc}") from exc
