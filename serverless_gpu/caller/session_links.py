"""How a session's caller reaches its ranks (``wire/session.py`` says what they say).

* :class:`FifoLink`: every rank is on this machine (the launcher's): one FIFO per rank in the
  session's folder of the run directory; the answers come in the run's event stream.
* :class:`TcpLink`: the ranks may be on other machines (a Ray cluster): the caller listens on
  the address the cluster knows it by; each rank connects, shows the session's secret
  (``wire/session.hello_bytes``), reads its cells from the connection and sends its events
  back in it, so a cell's output and answer come at once, not with the backend's periodic
  batches. The backend hands those events on (:meth:`TcpLink.attach`).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import pickle
import secrets
import shutil
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from serverless_gpu.common import settings
from serverless_gpu.common.group_store import listening_store
from serverless_gpu.runfiles.streamed import read_message
from serverless_gpu.wire.session import (
    HELLO_BYTES,
    TOKEN_BYTES,
    frame_parts,
    read_hello,
    session_fifo,
    write_frame,
)

_HELLO_S = 10.0
"""How long a new connection may take to say who it is before it is dropped."""
_ACCEPT_SLICE_S = 0.5
_STORE_WAIT = timedelta(seconds=60)
"""How long a re-formed group's store waits for its ranks."""


class FifoLink:
    """One FIFO per rank in ``session_dir`` (0600 in the 0700 run directory)."""

    remote = False

    def __init__(self, session_dir: Path, world: int) -> None:
        self.session_dir = session_dir
        session_dir.mkdir(mode=0o700)
        for rank in range(world):
            os.mkfifo(session_fifo(session_dir, rank), 0o600)
        # O_RDWR: never blocks on a FIFO with no reader yet, and the rank sees EOF only when
        # this process (the one writer) is gone.
        self._fds = [os.open(session_fifo(session_dir, r), os.O_RDWR) for r in range(world)]
        self._lock = threading.Lock()

    def env(self) -> dict[str, str]:
        return {}

    def group_store(self, world: int) -> tuple[Any, str]:
        """A re-formed group's store: the ranks make a file store in the session folder."""
        return None, ""

    def send(self, message: object) -> None:
        with self._lock:
            for fd in self._fds:
                with contextlib.suppress(OSError):  # closed meanwhile; the run's end says why
                    write_frame(fd, message)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.session_dir, ignore_errors=True)


class TcpLink:
    """A listener on ``host`` for the session's ``world`` ranks. Frames sent before a rank has
    connected wait for it (as a FIFO holds them); a connection that does not show the secret
    first is closed."""

    remote = True

    def __init__(self, host: str, world: int) -> None:
        self.host = host
        self.world = world
        self.token = secrets.token_hex(TOKEN_BYTES // 2)
        self._listener = socket.create_server((host, 0), backlog=world + 8)
        self._listener.settimeout(_ACCEPT_SLICE_S)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        """Guards the connections, the frames waiting for a rank and the event hand-off."""
        self._send_lock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}
        self._waiting: dict[int, list[Any]] = {r: [] for r in range(world)}
        self._deliver: Callable[[list[Any]], None] | None = None
        self._early: list[Any] = []
        self._closed = False
        accept = threading.Thread(target=self._accept, name="serverless-gpu-link", daemon=True)
        accept.start()

    def env(self) -> dict[str, str]:
        return {
            settings.SESSION_ADDRESS.name: f"{self.host}:{self.port}",
            settings.SESSION_TOKEN.name: self.token,
        }

    def group_store(self, world: int) -> tuple[Any, str]:
        """A re-formed group's store, for ranks that share no folder: a ``TCPStore`` this
        process keeps, listening on the address the ranks reach it at; and that address."""
        store = listening_store(self.host, 0, world, _STORE_WAIT)
        return store, f"{self.host}:{store.port}"

    def attach(self, deliver: Callable[[list[Any]], None]) -> None:
        """The backend's way to hand the ranks' events to the run (its logs, stacks, handle)."""
        with self._lock:
            self._deliver, early, self._early = deliver, self._early, []
        if early:
            deliver(early)

    def send(self, message: object) -> None:
        parts = frame_parts(message)
        with self._send_lock:  # one message's bytes at a time on every connection
            with self._lock:
                conns = [c for r, c in sorted(self._conns.items())]
                for rank in set(range(self.world)) - set(self._conns):
                    self._waiting[rank].extend(parts)
            if len(parts) == 1 or len(conns) < 2:
                for conn in conns:
                    _send_parts(conn, parts)
                return
            # tensors to several ranks: each connection sends at once, not one after another
            senders = [
                threading.Thread(target=_send_parts, args=(conn, parts), daemon=True)
                for conn in conns
            ]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    # -- threads -------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed and len(self._conns) < self.world:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            rank = self._greeted(conn)
            if rank is None:
                conn.close()
                continue
            self._join(rank, conn)

    def _greeted(self, conn: socket.socket) -> int | None:
        conn.settimeout(_HELLO_S)  # recv, not os.read: a socket with a timeout is non-blocking
        data = b""
        try:
            while len(data) < HELLO_BYTES:
                piece = conn.recv(HELLO_BYTES - len(data))
                if not piece:
                    return None
                data += piece
        except OSError:
            return None
        rank, token = read_hello(data)
        if not 0 <= rank < self.world or not hmac.compare_digest(token, self.token.encode()):
            return None
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return rank

    def _join(self, rank: int, conn: socket.socket) -> None:
        with self._send_lock:
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns[rank] = conn
                waiting, self._waiting[rank] = self._waiting[rank], []
            _send_parts(conn, waiting)
        reader = threading.Thread(
            target=self._read, args=(conn,), name=f"serverless-gpu-session-{rank}", daemon=True
        )
        reader.start()

    def _read(self, conn: socket.socket) -> None:
        while True:
            try:
                batch = read_message(conn.fileno())  # a cell's value: its tensors follow
            except (OSError, EOFError, pickle.UnpicklingError):
                batch = None
            if not isinstance(batch, list):
                return  # the rank closed it (the session's end) or is gone
            with self._lock:
                deliver = self._deliver
                if deliver is None:
                    self._early.extend(batch)
                    continue
            deliver(batch)


def _send_parts(conn: socket.socket, parts: list[Any]) -> None:
    try:
        for part in parts:
            conn.sendall(part)
    except OSError:  # the rank is gone; the run's end says why
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
