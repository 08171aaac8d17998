"""Find complete checkpoints under a root directory."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from serverless_gpu.data._fs import join, mtime_of, resolve
from serverless_gpu.data.checkpoint import METADATA, VolumeReader
from serverless_gpu.data.errors import VolumeError

__all__ = ["checkpoint_path", "is_complete", "latest_checkpoint"]

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def checkpoint_path(root: str | os.PathLike[str], step: int) -> str:
    """The conventional directory for ``step`` under ``root``: ``<root>/step_000000123``."""
    return f"{os.fspath(root).rstrip('/')}/step_{step:09d}"


def is_complete(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> bool:
    """True when ``path`` holds a published checkpoint (its ``.metadata`` exists)."""
    fs, inner = resolve(path, storage_options)
    fs.invalidate_cache(inner)
    return bool(fs.exists(join(inner, METADATA)))


def latest_checkpoint(
    root: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    *,
    verify: bool = True,
) -> str | None:
    """The newest complete checkpoint directly under ``root``, or ``None`` if there is none.

    Only sub-directories with a ``.metadata`` count (interrupted saves are ignored). With
    ``verify`` (the default) a step is also passed over, with a warning, when its ``.metadata``
    cannot be read or a shard does not match the size and checksum recorded when it was saved
    (this reads the step's shards: the load that follows finds them in the page cache). "Newest":
    directories whose name ends in a number (``step_000123``, ``ckpt-7``) are ordered by that
    number and rank above names without one; ties and unnumbered names are ordered by the
    modification time of their ``.metadata``. A missing ``root`` gives ``None``. The result is
    ``root`` joined with the directory name, so it keeps ``root``'s URL form.
    """
    fs, inner = resolve(root, storage_options)
    fs.invalidate_cache(inner)
    if not fs.isdir(inner):
        return None
    found = fs.glob(join(inner, "*", METADATA), detail=True)
    ranked: list[tuple[tuple[int, int, float], str]] = []
    for meta_path, info in found.items():
        name = meta_path.rstrip("/").split("/")[-2]
        number = _TRAILING_NUMBER.search(name)
        ranked.append(
            ((1 if number else 0, int(number.group(1)) if number else 0, mtime_of(info)), name)
        )
    for _, name in sorted(ranked, reverse=True):
        path = f"{os.fspath(root).rstrip('/')}/{name}"
        if not verify or _intact(path, storage_options):
            return path
    return None


def _intact(path: str, storage_options: dict[str, Any] | None) -> bool:
    """Whether the checkpoint at ``path`` reads whole; a warning says why not."""
    reader = VolumeReader(path, storage_options=storage_options)
    try:
        reader.storage_data = reader.read_metadata().storage_data
        reader.check_checksums()
    except (VolumeError, OSError) as exc:
        warnings.warn(f"passing over the damaged checkpoint {path}: {exc}", stacklevel=3)
        return False
    return True
