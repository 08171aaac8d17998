"""The launcher's end of a socketpair: messages in and out without ever blocking.

The launcher serves every rank and its caller from one loop, so no peer may stall it: a rank
stopped (SIGSTOP, a debugger) half-way through a large message, or a peer that stops reading,
must cost buffered bytes, never a blocked read or write. Frames are those of
``multiprocessing.connection.Connection`` (a 4-byte big-endian length, or -1 and an 8-byte
length, then a pickle), so the other end (the caller's reader thread, a rank's worker) keeps
using a plain blocking ``Connection``.
"""

from __future__ import annotations

import os
import pickle
import selectors
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

_READ_CHUNK = 1 << 20
_READ_PER_CALL = 16 << 20
"""A peer that keeps sending is read in turns with the others, not until it stops."""


class Undecodable:
    """A frame whose pickle could not be loaded here (the launcher lacks the sender's class)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Channel:
    """Non-blocking, buffered, framed messages over one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.fd = sock.detach()
        os.set_blocking(self.fd, False)
        self._in = bytearray()
        self._out: deque[memoryview] = deque()
        self.broken = False
        """The peer is gone: a write failed (EPIPE) or a read found the end."""
        self.last_read = 0
        """Bytes the latest ``receive`` read (a large message may still be incomplete)."""
        self._selector: selectors.BaseSelector | None = None
        self._callback: Callable[[Any], None] | None = None
        self._events = 0

    def fileno(self) -> int:
        return self.fd

    @property
    def closed(self) -> bool:
        return self.fd < 0

    @property
    def pending(self) -> int:
        """Bytes queued for the peer and not written yet."""
        return sum(len(view) for view in self._out)

    # -- sending -------------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queue one message and write what the socket takes now; never blocks."""
        if self.broken or self.closed:
            return
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(body)
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
        self._out.append(memoryview(header))
        self._out.append(memoryview(body))
        self.flush()

    def flush(self) -> bool:
        """Write what the socket takes; True once nothing is left queued."""
        while self._out and not self.broken:
            view = self._out[0]
            try:
                written = os.write(self.fd, view)
            except BlockingIOError:
                break
            except OSError:  # EPIPE, ECONNRESET: the peer closed its end
                self._peer_gone()
                break
            if written == len(view):
                self._out.popleft()
            else:
                self._out[0] = view[written:]
        self._update_events()
        return not self._out

    # -- receiving -----------------------------------------------------------------------------

    def receive(self) -> tuple[list[Any], bool]:
        """The complete messages readable now, and whether the peer has closed its end.

        A partial frame stays buffered until the rest arrives.
        """
        eof = False
        taken = 0
        while taken < _READ_PER_CALL and not self.closed:
            try:
                data = os.read(self.fd, _READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:  # ECONNRESET
                data = b""
            if not data:
                eof = True
                self._peer_gone()
                break
            self._in += data
            taken += len(data)
        self.last_read = taken
        return self._frames(), eof

    def _frames(self) -> list[Any]:
        messages: list[Any] = []
        start = 0
        buf = self._in
        while len(buf) - start >= 4:
            (size,) = struct.unpack_from("!i", buf, start)
            header = 4
            if size == -1:
                if len(buf) - start < 12:
                    break
                (size,) = struct.unpack_from("!Q", buf, start + 4)
                header = 12
            end = start + header + size
            if len(buf) < end:
                break
            try:
                messages.append(pickle.loads(memoryview(buf)[start + header : end]))
            except Exception as exc:  # a class the launcher cannot import, say
                messages.append(Undecodable(exc))
            start = end
        if start:
            del self._in[:start]
        return messages

    # -- selector ------------------------------------------------------------------------------

    def attach(self, selector: selectors.BaseSelector, on_readable: Callable[[], None]) -> None:
        """Watch this channel: ``on_readable`` runs when there is something to read; queued
        output is written whenever the socket takes more."""
        self._selector = selector
        self._callback = lambda _fd: self._ready(on_readable)
        self._events = selectors.EVENT_READ
        selector.register(self.fd, self._events, self._callback)
        self._update_events()

    def detach(self) -> None:
        if self._selector is not None and self._events:
            try:
                self._selector.unregister(self.fd)
            except (KeyError, ValueError):
                pass
        self._selector = None
        self._events = 0

    def _ready(self, on_readable: Callable[[], None]) -> None:
        self.flush()
        if self._selector is not None:
            on_readable()

    def _update_events(self) -> None:
        if self._selector is None or self._callback is None or not self._events:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._out else 0)
        if events != self._events:
            self._selector.modify(self.fd, events, self._callback)
            self._events = events

    def _peer_gone(self) -> None:
        self.broken = True
        self._out.clear()

    def close(self) -> None:
        self.detach()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._out.clear()
        self._in.clear()
