"""Types shared by the serverless_gpu.data tests (a uniquely named module, so test modules
need not import from ``conftest``, a name every test directory uses)."""

from __future__ import annotations

import contextlib
import socket
import threading
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


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 in front of a real server. After :meth:`freeze` it stops
    answering: connections are still accepted and held open, and no byte passes either way (a
    server that hangs, not one that refuses)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._frozen = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self._frozen.set()

    def close(self) -> None:
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self._frozen.is_set():
                continue  # held open, never answered
            upstream = socket.create_connection(self.target)
            self._sockets.append(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if not self._frozen.is_set():  # frozen: read and dropped, nothing passes
                    dst.sendall(data)
            except OSError:
                return
