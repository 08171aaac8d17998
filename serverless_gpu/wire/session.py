"""What a persistent session's caller and ranks say to each other about cells.

The caller writes :class:`CellRequest`, :class:`Interrupt` and :class:`CloseSession` frames into
one FIFO per rank in the session's folder of the run directory (``session_fifo``), or, where the
ranks may be on other machines (a Ray cluster), into one TCP connection per rank that the rank
opened to the caller with a hello (``hello_bytes``: its rank and the session's secret, not a
pickle: nothing is unpickled from a peer before it has shown the secret); the ranks answer each
cell with a :class:`CellDone` through ``runtime.send_to_caller`` (kind ``CELL_DONE``), which
reaches the caller as a ``RankMessage`` in the run's one event stream, after the output the rank
wrote during the cell (over TCP the rank's events travel in the same connection, as lists).
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serverless_gpu.wire.events import CellEnd
from serverless_gpu.wire.protocol import ErrorRecord

CELL_DONE = "serverless_gpu.session.cell"
"""``RankMessage.kind`` of a rank's answer to a cell."""
GROUP_NOTE = "serverless_gpu.session.group"
"""``RankMessage.kind`` of a rank's note that it re-formed its process group."""

EXEC, RUN, PUSH, PULL = "exec", "run", "push", "pull"

_HEADER = struct.Struct("<I")


@dataclass(frozen=True)
class CellRequest:
    number: int
    kind: str
    """``EXEC`` (``data``: the code), ``RUN`` (cloudpickled ``(fn, args, kwargs)``), ``PUSH``
    (``data``: the path of the values' file) or ``PULL`` (``data``: the name)."""
    data: Any
    filename: str = ""
    """The code's file name in tracebacks (``EXEC``)."""
    label: str | None = None
    """How tracebacks name that file (``Cell In[4]``)."""
    reform_group: int = 0
    """Non-zero: destroy the process group and form generation ``reform_group`` first (a
    collective of the last cell broke it)."""
    fallback: bytes | None = None
    """Pickled ``{name: value}`` from the caller for names the namespace lacks (a magic cell's
    notebook names); set only where missing."""
    results_dir: str = ""
    """Where a value too large for a message is written; empty: every value travels in the
    answer (a rank that cannot reach the caller's files)."""
    reform_store: str = ""
    """With ``reform_group``: ``host:port`` of the store the caller keeps for the new
    generation; empty: a file store in the session's folder (every rank on this machine)."""


class Streamed:
    """A value whose tensors' bytes follow its frame on a stream, raw (a remote session's push
    and a large cell value: ``runfiles/streamed.py`` makes and reads them). Only ``meta`` and
    ``parts`` are pickled; ``buffers`` (the sender's) and ``value`` (the receiver's) stay."""

    def __init__(self, meta: bytes, parts: tuple[tuple[int, int], ...]) -> None:
        self.meta = meta
        """The value pickled without its storages (``tensor_file.split``)."""
        self.parts = parts
        """(the offset its persistent ids name, bytes) of each storage, in stream order."""
        self.buffers: list[Any] = []
        self.value: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"meta": self.meta, "parts": self.parts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["meta"], state["parts"])  # type: ignore[misc]


def streamed_in(message: object) -> list[Streamed]:
    """The :class:`Streamed` values of a frame (a push, or cell answers in a list of events),
    in the order their bytes follow it."""
    if isinstance(message, CellRequest):
        return [message.data] if isinstance(message.data, Streamed) else []
    if isinstance(message, list):
        answers = (getattr(event, "data", None) for event in message)
        return [a.streamed for a in answers if isinstance(a, CellDone) and a.streamed]
    return []


@dataclass(frozen=True)
class Interrupt:
    number: int


@dataclass(frozen=True)
class CloseSession:
    pass


@dataclass(frozen=True)
class CellDone(CellEnd):
    """A rank's answer to a cell: a :class:`CellEnd`, the protocol's flag of a cell's end."""

    number: int
    error: ErrorRecord | None = None
    value: bytes | None = None
    """The cell's value pickled (small values), or None with ``value_file``."""
    value_file: str = ""
    group: bool = False
    """A default process group exists after the cell."""
    names: tuple[str, ...] = ()
    """The namespace's names after the cell (rank 0 only)."""
    peak_memory: int = 0
    """Bytes of device memory allocated now in this rank (CUDA), 0 in CPU mode."""
    streamed: Streamed | None = None
    """The value, with its tensors' bytes after the frame (a remote session's answer)."""


TOKEN_BYTES = 32
"""The session's secret: 32 hex characters."""
_HELLO = struct.Struct(f"<I{TOKEN_BYTES}s")


def hello_bytes(rank: int, token: str) -> bytes:
    return _HELLO.pack(rank, token.encode("ascii"))


HELLO_BYTES = _HELLO.size


def read_hello(data: bytes) -> tuple[int, bytes]:
    """A new connection's rank and secret (as sent), from its first ``HELLO_BYTES``."""
    rank, token = _HELLO.unpack(data)
    return int(rank), bytes(token)


def session_fifo(session_dir: Path | str, rank: int) -> Path:
    return Path(session_dir) / f"in_{rank}"


def frame_bytes(message: object) -> bytes:
    """``message`` pickled, behind its length."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def frame_parts(message: object) -> list[Any]:
    """What goes on a stream for ``message``: its frame, then the raw bytes of its
    :class:`Streamed` values' tensors."""
    return [frame_bytes(message), *(b for v in streamed_in(message) for b in v.buffers)]


def write_frame(fd: int, message: object) -> None:
    view = memoryview(frame_bytes(message))
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int) -> object | None:
    """The next message, or None at EOF (every writer closed: the caller is gone)."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def read_into(fd: int, view: memoryview) -> None:
    """Fill ``view`` from ``fd``; ``EOFError`` if the stream ends first."""
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done:]])
        if not got:
            raise EOFError("the stream ended inside a value")
        done += got


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
