"""The MLflow UI's door: a TCP port on 127.0.0.1 that lets in the store's owner alone.

A browser can only reach the UI over TCP, and any local user can connect to 127.0.0.1. So the
MLflow server listens on a Unix socket in a private folder, and the gate, in the UI's guard
process, accepts each TCP connection, asks the kernel who owns the other end (the socket table
in ``/proc/net/tcp``, which names the uid of every socket on this machine's loopback), and
relays the connection to the server only when that is the user who started the UI. Anyone else
gets ``403 Forbidden``. The same table tells who listens on a port, so that a link is never
handed out for a port that another user's process holds.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"
_TIME_WAIT = "06"
"""A closed socket's remains, which the table lists under uid 0 whoever owned it."""
_CHUNK = 65536
_PROBE_S = 0.5
_FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
    b"This MLflow UI serves its owner's store to its owner only.\n"
)
_STARTING = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 2\r\n"
    b"Connection: close\r\n\r\nThe MLflow UI is starting; reload in a few seconds.\n"
)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class _Socket(NamedTuple):
    local: tuple[Address, int]
    remote: tuple[Address, int]
    state: str
    uid: int


def _address(field: str) -> tuple[Address, int]:
    """``0100007F:1F90`` (the kernel's words, in host byte order) as (127.0.0.1, 8080); an
    IPv4-mapped IPv6 address as its IPv4 address."""
    raw, port = field.split(":")
    words = (int(raw[i : i + 8], 16) for i in range(0, len(raw), 8))
    packed = b"".join(w.to_bytes(4, sys.byteorder) for w in words)
    return _unmapped(ipaddress.ip_address(packed)), int(port, 16)


def _sockets(local_port: int) -> Iterator[_Socket]:
    """The table's sockets whose local port is ``local_port``. The table has a line for every
    socket of the machine (thousands on a busy one): lines of other ports are skipped on their
    text, before any address is parsed."""
    suffix = f":{local_port:04X}"
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            if suffix + " " not in line:  # neither address has that port
                continue
            fields = line.split()
            if len(fields) > 7 and fields[1].endswith(suffix):
                yield _Socket(_address(fields[1]), _address(fields[2]), fields[3], int(fields[7]))


def peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the other end of a loopback connection; None if the table lacks it."""
    host, port = conn.getpeername()[:2]
    ours_host, ours_port = conn.getsockname()[:2]
    peer = (_unmapped(ipaddress.ip_address(host)), port)
    ours = (_unmapped(ipaddress.ip_address(ours_host)), ours_port)
    for entry in _sockets(port):
        if entry.local == peer and entry.remote == ours and entry.state != _TIME_WAIT:
            return entry.uid
    return None


def listener_uid(port: int) -> int | None:
    """The uid of whoever listens on ``port`` where 127.0.0.1 reaches it; None: nobody."""
    if not _accepts(port):  # the usual answer, without the table (its read takes ~15 ms)
        return None
    for entry in _sockets(port):
        ip, bound = entry.local
        if entry.state == _LISTEN and bound == port and (ip.is_loopback or ip.is_unspecified):
            return entry.uid
    return None


def _accepts(port: int) -> bool:
    """Whether something may listen on 127.0.0.1:``port``: only a refused connection (at once,
    where nobody listens) says no; a pending one (a full backlog) or another error says maybe."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(_PROBE_S)
        return probe.connect_ex(("127.0.0.1", port)) != errno.ECONNREFUSED


def _unmapped(ip: Address) -> Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def serve(listener: socket.socket, upstream: str) -> None:
    """Accept connections on ``listener`` for ever (daemon threads), relaying the owner's."""
    threading.Thread(target=_accept_loop, args=(listener, upstream), daemon=True).start()


def _accept_loop(listener: socket.socket, upstream: str) -> None:
    owner = os.getuid()
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # the listener was closed: the guard is stopping
        threading.Thread(target=_admit, args=(conn, upstream, owner), daemon=True).start()


def _admit(conn: socket.socket, upstream: str, owner: int) -> None:
    with contextlib.closing(conn):
        try:
            allowed = peer_uid(conn) == owner
        except OSError:
            allowed = False  # the peer is gone already, or the table cannot be read: no entry
        if not allowed:
            _answer(conn, _FORBIDDEN)
            return
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.closing(server):
            try:
                server.connect(upstream)
            except OSError:  # the MLflow server has not bound its socket yet
                _answer(conn, _STARTING)
                return
            back = threading.Thread(target=_pipe, args=(server, conn), daemon=True)
            back.start()
            _pipe(conn, server)
            back.join()


def _answer(conn: socket.socket, reply: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(reply)
        conn.shutdown(socket.SHUT_WR)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until end-of-file, then pass the end on (HTTP keep-alive and half-closes work)."""
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
