"""Find complete checkpoints under a root directory."""

from __future__ import annotations

import os
import re
from typing import Any

from serverless_gpu.data._fs import join, mtime_of, resolve
from serverless_gpu.data.checkpoint import METADATA

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
    root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> str | None:
    """The newest complete checkpoint directly under ``root``, or ``None`` if there is none.

    Only sub-directories with a ``.metadata`` count (interrupted saves are ignored). "Newest":
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
    best: tuple[tuple[int, int, float], str] | None = None
    for meta_path, info in found.items():
        name = meta_path.rstrip("/").split("/")[-2]
        number = _TRAILING_NUMBER.search(name)
        key = (1 if number else 0, int(number.group(1)) if number else 0, mtime_of(info))
        if best is None or key > best[0]:
            best = (key, name)
    if best is None:
        return None
    return f"{os.fspath(root).rstrip('/')}/{best[1]}"
