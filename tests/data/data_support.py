"""Types shared by the serverless_gpu.data tests (a uniquely named module, so test modules
need not import from ``conftest``, a name every test directory uses)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec


@dataclass
class Storage:
    """Where a test keeps volumes and checkpoints: a local directory or an S3 bucket."""

    kind: str
    root: str
    storage_options: dict[str, Any]
    fs: fsspec.AbstractFileSystem

    def url(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write(self, relpath: str, data: bytes) -> None:
        path = self.url(relpath)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(path, data)

    def ls_names(self, relpath: str) -> set[str]:
        self.fs.invalidate_cache()
        return {
            p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.url(relpath), detail=False)
        }


@dataclass
class RankRun:
    returncodes: list[int]
    results: list[dict[str, Any] | None]
    logs: list[str]


Launch = Callable[..., RankRun]
