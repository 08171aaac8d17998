"""Messages between the caller, the launcher and the ranks: small typed dataclasses.

Every channel is a ``socket.socketpair`` (a unix socket with exactly two ends, created by the
parent and inherited by the child), so no other process can connect to it. Messages are framed
and pickled as ``multiprocessing.connection.Connection`` does; the launcher's ends never block
(``channel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serverless_gpu.common.errors import FailureKind, RankFailure
from serverless_gpu.wire.env import rank_env
from serverless_gpu.wire.runspec import RunSpec

# --- caller -> launcher ------------------------------------------------------------------
# A call is sent as its ``runspec.RunSpec``; then these.


@dataclass(frozen=True)
class CancelRun:
    run_id: str
    reason: str
    force: bool = False
    """Stop at once, without asking the ranks first (a second Cancel or interrupt)."""


@dataclass(frozen=True)
class TakeStacks:
    """Signal the run's live ranks to dump their stacks (and flight recorder); the caller
    reads the dumps from the run directory."""

    run_id: str


@dataclass(frozen=True)
class Prewarm:
    """Prepare standby ranks for calls of this shape (issued when a function is decorated)."""

    device: str
    world_size: int
    preload: tuple[str, ...] = ()
    """Modules to import in the launcher first, so forked ranks start with them (``mlflow``)."""
    env: dict[str, str] | None = None
    """The caller's environment as far as process groups read it (``env.group_env``): standby
    ranks are made under it; None leaves the launcher's own."""
    warm_group: bool = True
    """Form the standby ranks' process group ahead of the call (``warm_process_group``)."""


@dataclass(frozen=True)
class Shutdown:
    pass


# --- launcher -> caller (besides the events of ``events.py``) ----------------------------


@dataclass(frozen=True)
class RunAccepted:
    """The launcher has taken this RunSpec: from now on it reports the run's end. A run that
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
    """What a rank needs to run its part of one call (``rank/become.py``); the rest derives
    from ``run``. A Ray rank's adds what only the caller knows of its node
    (``backends/ray/rank_spec.py``)."""

    run: RunSpec
    rank: int
    master_port: int
    """The TCP port of rank 0's rendezvous store (on 127.0.0.1, or rank 0's Ray node)."""
    warm_group: bool = False
    """Every rank of the call holds a formed process group (``warm_group.py``): the user's
    ``init_process_group`` takes it. False: a rank that formed one drops it first."""

    def env(self) -> dict[str, str]:
        """The complete environment of the rank."""
        run = self.run
        return rank_env(
            run.env,
            rank=self.rank,
            world_size=run.world_size,
            master_port=self.master_port,
            device=run.device,
            run_id=run.run_id,
            run_dir=str(run.paths.run_dir),
        )


@dataclass(frozen=True)
class Release:
    """Every rank has returned: shut down the communicators and exit now (ranks wait for it,
    so rank 0's TCPStore outlives its peers)."""


# --- rank -> launcher --------------------------------------------------------------------


@dataclass(frozen=True)
class GroupReady:
    """A standby rank has tried to form its process group ahead of the call: ``ok`` if it
    holds one. The launcher sends the call's specs once every rank has said."""

    ok: bool


@dataclass(frozen=True)
class UserCodeStarted:
    time: float


@dataclass(frozen=True)
class UserCodeEnded:
    """The user's function returned or raised: the rank now sends what it logged and writes
    its answer (a peer's failure lets it finish that before stopping it)."""

    time: float


@dataclass(frozen=True)
class RankDone:
    """The rank's result (``ok``) or error record has been written to the run directory."""

    ok: bool
    time: float
    summary: str = ""
    """``"Tensor (3, 2) torch.float32"`` for a result, ``"ValueError: boom"`` for an error."""
    failure: RankFailure | None = None
    """How the rank failed (:meth:`RankFailure.reported`), when it did."""


@dataclass(frozen=True)
class ToCaller:
    """Data for the caller's subscribers (``runtime.send_to_caller``); forwarded as RankMessage."""

    kind: str
    data: Any
    time: float


# --- files in the run directory ----------------------------------------------------------


@dataclass(frozen=True)
class ErrorRecord:
    """A rank's exception, written to its error file (``RunPaths.error``); survives exceptions
    that cannot pickle."""

    rank: int
    time: float
    type_name: str
    message: str
    traceback_text: str
    kind: FailureKind
    """What the rank reported: ``RAISED`` (the function raised) or a failure of the library in
    the rank (``UNPICKLABLE_RESULT``, ``RESULT_NOT_WRITTEN``, ``CONNECTION_LOST``)."""
    exception: bytes | None = None
    """The pickled exception when it pickles, else ``None``."""

    @property
    def failure(self) -> RankFailure:
        """The rank's failure, worded (``RankFailure.reported``)."""
        return RankFailure.reported(self.rank, self.time, self.kind, self.type_name, self.message)
