"""Messages between the caller, the launcher and the ranks: small typed dataclasses.

Every channel is a ``socket.socketpair`` (a unix socket with exactly two ends, created by the
parent and inherited by the child), so no other process can connect to it. Messages are framed
and pickled as ``multiprocessing.connection.Connection`` does; the launcher's ends never block
(``channel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- caller -> launcher ------------------------------------------------------------------


@dataclass(frozen=True)
class StartRun:
    """Start one call's ranks."""

    run_id: str
    name: str
    run_dir: Path
    results_dir: Path | None
    """Where ranks write results first (a tmpfs), or None for the run directory."""
    payload_path: Path
    world_size: int
    device: str
    """``"cuda"`` or ``"cpu"``."""
    gpu_type: str
    gpu_names: tuple[str, ...]
    env: dict[str, str]
    """The caller's ``os.environ`` at call time plus per-call additions (not per-rank ones)."""
    cwd: str
    sys_path: tuple[str, ...]
    timeout: float | None
    grace: float
    """Seconds between SIGTERM and SIGKILL when ranks are stopped."""
    standby: bool = True
    """Keep standby ranks of this shape ready for the next call (the decorator's option)."""


@dataclass(frozen=True)
class CancelRun:
    run_id: str
    reason: str


@dataclass(frozen=True)
class Prewarm:
    """Prepare standby ranks for calls of this shape (issued when a function is decorated)."""

    device: str
    world_size: int
    preload: tuple[str, ...] = ()
    """Modules to import in the launcher first, so forked ranks start with them (``mlflow``)."""


@dataclass(frozen=True)
class Shutdown:
    pass


# --- launcher -> caller (besides the events of ``events.py``) ----------------------------


@dataclass(frozen=True)
class RunAccepted:
    """The launcher has taken this StartRun: from now on it reports the run's end. A run that
    was sent but never accepted (the launcher was exiting) is sent again to a fresh launcher."""

    run_id: str


@dataclass(frozen=True)
class RankGroups:
    """The process groups of every rank not reaped yet. Ranks die with the launcher (their
    parent-death signal), what they started does not: if the launcher dies without cleaning
    up, the caller kills these groups."""

    pgids: tuple[int, ...]


@dataclass(frozen=True)
class Exiting:
    """The launcher has begun its shutdown: it starts no more runs; calls need a fresh one."""


# --- launcher -> rank --------------------------------------------------------------------


@dataclass(frozen=True)
class RankSpec:
    """Everything a forked rank needs to run one call."""

    run_id: str
    name: str
    """The run's name (the function's qualified name), for the process title."""
    rank: int
    world_size: int
    env: dict[str, str]
    """The complete environment of the rank."""
    cwd: str
    sys_path: tuple[str, ...]
    payload_path: Path
    result_paths: list[Path]
    """Tried in order: a full tmpfs sends the result on to the next one."""
    error_path: Path


@dataclass(frozen=True)
class Release:
    """Every rank has returned: exit now (ranks wait, so rank 0's TCPStore outlives its peers)."""


# --- rank -> launcher --------------------------------------------------------------------


@dataclass(frozen=True)
class UserCodeStarted:
    time: float


@dataclass(frozen=True)
class RankDone:
    """The rank's result (``ok``) or error record has been written to the run directory."""

    ok: bool
    time: float
    summary: str = ""
    """``"Tensor (3, 2) torch.float32"`` for a result, ``"ValueError: boom"`` for an error."""


@dataclass(frozen=True)
class ToCaller:
    """Data for the caller's subscribers (``runtime.send_to_caller``); forwarded as RankMessage."""

    kind: str
    data: Any
    time: float


# --- files in the run directory ----------------------------------------------------------


@dataclass(frozen=True)
class ErrorRecord:
    """A rank's exception, written to ``error_N.pkl``; survives exceptions that cannot pickle."""

    rank: int
    time: float
    type_name: str
    message: str
    traceback_text: str
    exception: bytes | None = None
    """The pickled exception when it pickles, else ``None``."""
    library_error: bool = False
    """True when the library itself failed in the rank (e.g. the result could not be pickled)."""
    extra: dict[str, str] = field(default_factory=dict)
