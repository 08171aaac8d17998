"""The one stream of events a run produces.

The console printer, the notebook widget and MLflow tracking are subscribers; none of them
captures output or polls processes on its own. Events are small frozen dataclasses that cross
process boundaries (launcher -> caller) by pickle.

Subscribers are called in the thread that waits on the run (``RunHandle.wait``), in event order.
A subscriber is any callable; renderers derive from :class:`EventSubscriber`, which dispatches each
event once, by its type, to one method per kind of event.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serverless_gpu.common.errors import RankFailure, root_cause

if TYPE_CHECKING:
    from serverless_gpu.wire.runspec import RunSpec


class RunStatus(str, enum.Enum):
    """Lifecycle of a whole run."""

    QUEUED = "queued"
    """Waiting for devices: other runs of this caller hold them (``allocation.py``)."""
    STARTING = "starting"
    """Its devices are allocated and its ranks are starting."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING)

    def __hash__(self) -> int:
        # Equal statuses hash alike, also across the original API's names (caller/statuses.py):
        # a timeout compares equal to its FAILED as a failure does, so it hashes as "failed"
        # and `h.status in {RunStatus.COMPLETED, RunStatus.FAILED, ...}` finds it.
        return hash(RunStatus.FAILED.value if self is RunStatus.TIMED_OUT else self.value)

    @classmethod
    def _missing_(cls, value: object) -> RunStatus | None:
        # Records written before the status was named for what it shows said "pending".
        return cls.STARTING if value == "pending" else None


class RankState(str, enum.Enum):
    """Lifecycle of one rank, in this order: the launcher's supervisor, the console, the
    renderers and their summaries all speak of a rank in these states."""

    STARTING = "starting"
    """Forked, waiting for its spec or loading the payload."""
    RUNNING = "running"
    """In the user's function."""
    DONE = "done"
    """Returned; its result is written."""
    FAILED = "failed"
    """Raised, crashed or exited without a result; or the root cause of a failed run."""
    STOPPED = "stopped"
    """Stopped by the library (another rank failed, the run timed out or was cancelled)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class RunStarted:
    """The run's ranks are being started."""

    run_id: str
    name: str
    """Qualified name of the user's function."""
    world_size: int
    device: str
    """``"cuda"`` or ``"cpu"``."""
    gpu_type: str
    gpu_names: tuple[str, ...]
    run_dir: Path
    timeout: float | None
    time: float

    @classmethod
    def of(cls, spec: RunSpec, time: float) -> RunStarted:
        """The event of a run starting, in the words of its spec."""
        p = spec.placement
        return cls(
            spec.run_id,
            spec.name,
            p.world_size,
            p.device,
            p.gpu_type.value,
            p.gpu_names,
            spec.paths.run_dir,
            spec.timeout,
            time,
        )


@dataclass(frozen=True)
class RunQueued:
    """Too few devices are free: the run waits in the launcher's queue."""

    run_id: str
    ahead: int
    """Runs waiting before this one."""
    time: float
    holders: str = ""
    """Who holds the devices it waits for (``session 's' holds CPU slots 0, 1``)."""


@dataclass(frozen=True)
class RunWaiting:
    """The run waits for its backend to find room for its ranks (a Ray cluster that must
    grow); ``message`` says what is missing, and is repeated when it changes. An empty
    ``message`` ends the wait."""

    run_id: str
    message: str
    time: float


@dataclass(frozen=True)
class RunScheduled:
    """The run got its devices; its ranks are being started on them."""

    run_id: str
    devices: tuple[str, ...]
    """GPU entries (as ``CUDA_VISIBLE_DEVICES`` names them) or CPU slot numbers."""
    time: float


@dataclass(frozen=True)
class RankStarted:
    """A rank process received its payload and is about to run user code."""

    run_id: str
    rank: int
    pid: int
    time: float
    node: str = ""
    """Where the rank runs, when that is not the caller's machine (``"node 1 (10.0.0.7)"``)."""


@dataclass(frozen=True)
class OutputLines:
    """Lines a rank wrote to stdout or stderr, captured at the file-descriptor level.

    Each line keeps its terminator: ``"\\n"`` for a finished line, ``"\\r"`` for a progress line
    that the next line overwrites (tqdm); a final unterminated fragment has none.
    """

    run_id: str
    rank: int
    stream: str
    """``"stdout"`` or ``"stderr"``."""
    lines: tuple[str, ...]
    time: float


@dataclass(frozen=True)
class RankFinished:
    """A rank process ended; in a successful run, the rank returned (``exit_code`` None: the
    run is reported before its processes' teardown)."""

    run_id: str
    rank: int
    state: RankState
    exit_code: int | None
    signal_name: str | None
    time: float
    summary: str = ""
    """What the rank returned (type, shape) or raised (type and first line of the message)."""


@dataclass(frozen=True)
class RunFinished:
    """The run is over; results (or the root-cause failure) are final. A failed or stopped
    run's rank processes are gone; a successful run is reported as soon as every rank has
    written its result, and its processes exit (communicator and CUDA teardown) after.

    Made by the named constructors (:meth:`succeeded`, :meth:`rank_failed`,
    :meth:`run_failed`, :meth:`stopped`), which word ``message``."""

    run_id: str
    status: RunStatus
    root_cause_rank: int | None
    """The rank whose failure came first in time, if the run failed."""
    message: str
    """Why the run did not succeed, in one line (``"rank 1 raised ValueError: x"``,
    ``"exceeded its timeout of ..."``); on success empty, or how it was stopped early."""
    unfinished_ranks: tuple[int, ...]
    """Ranks that had not returned when the run was stopped (timeout, cancel, failure)."""
    time: float
    failures: tuple[RankFailure, ...] = ()
    """Every rank's own failure, first in time first; ranks the library stopped are not
    failures."""

    @classmethod
    def succeeded(cls, run_id: str, time: float, note: str = "") -> RunFinished:
        """Every rank returned; ``note`` says how a stop asked for came to nothing."""
        return cls(run_id, RunStatus.SUCCEEDED, None, note, (), time)

    @classmethod
    def rank_failed(
        cls,
        run_id: str,
        failures: tuple[RankFailure, ...],
        unfinished: tuple[int, ...],
        time: float,
    ) -> RunFinished:
        """A rank failed; the root cause is the first failure in time (:func:`root_cause`)."""
        root = root_cause(failures)
        if root is None:
            raise ValueError("a failed run's RunFinished needs the rank failures")
        ordered = tuple(sorted(failures, key=lambda f: (f is not root, f.time, f.rank)))
        return cls(run_id, RunStatus.FAILED, root.rank, root.text, unfinished, time, ordered)

    @classmethod
    def run_failed(
        cls,
        run_id: str,
        message: str,
        unfinished: tuple[int, ...],
        time: float,
        failures: tuple[RankFailure, ...] = (),
    ) -> RunFinished:
        """The run itself failed (its supervision, its placement), not one of its ranks."""
        return cls(run_id, RunStatus.FAILED, None, message, unfinished, time, failures)

    @classmethod
    def stopped(
        cls,
        run_id: str,
        status: RunStatus,
        message: str,
        unfinished: tuple[int, ...],
        time: float,
        failures: tuple[RankFailure, ...] = (),
    ) -> RunFinished:
        """The run was stopped: ``TIMED_OUT`` or ``CANCELLED`` (the reason given)."""
        return cls(run_id, status, None, message, unfinished, time, failures)

    @property
    def root_cause(self) -> RankFailure | None:
        """The root-cause rank's failure (first of ``failures``), if the run failed."""
        if self.root_cause_rank is None or not self.failures:
            return None
        return self.failures[0]

    @property
    def cause(self) -> str:
        """The root-cause rank's failure as it reads after ``rank N`` (``"raised ValueError:
        x"``, ``"was killed by SIGSEGV"``); empty when no rank is the root cause."""
        root = self.root_cause
        return root.message if root is not None else ""


class CellEnd:
    """The base of what a rank sends (``runtime.send_to_caller``) to end one cell of a run that
    goes on: a persistent session's answer to a cell (``wire/session.py``'s ``CellDone``). It is
    the protocol's flag for that case: the launcher forwards the output the rank wrote before
    it, tracking keeps the cell's code; nobody matches a message's kind by name."""

    number: int
    """The cell's number, from 1."""


def ends_cell(data: object) -> bool:
    """Whether a rank's message to the caller ends a cell (the run goes on)."""
    return isinstance(data, CellEnd)


@dataclass(frozen=True)
class RankMessage:
    """Data a rank sent to the caller with ``runtime.send_to_caller`` (e.g. buffered metrics)."""

    run_id: str
    rank: int
    kind: str
    data: Any
    time: float

    @property
    def cell_ended(self) -> int | None:
        """The number of the cell this message ends while the run goes on (a persistent
        session's answer, :class:`CellEnd`); None for any other message."""
        return self.data.number if isinstance(self.data, CellEnd) else None


@dataclass(frozen=True)
class SystemMetrics:
    """Host and GPU utilisation, sampled in the caller (psutil, NVML) while the run is live.

    Keys follow MLflow's system-metric names (``system/gpu_0_utilization_percentage`` ...).
    """

    run_id: str
    values: dict[str, float]
    time: float


@dataclass(frozen=True)
class RanksSilent:
    """Ranks that showed no sign of life (output line, metric, ``runtime.heartbeat()``) for
    ``seconds`` while the run goes on; made in the caller (``hangs.py``). Nothing is stopped:
    ``RunHandle.stacks()`` shows where they are. An empty ``ranks`` ends an earlier warning."""

    run_id: str
    ranks: tuple[int, ...]
    seconds: float
    everyone: bool
    """Every running rank is silent (a hang), not only some (stragglers)."""
    time: float


Event = (
    RunStarted
    | RunQueued
    | RunWaiting
    | RunScheduled
    | RankStarted
    | OutputLines
    | RankFinished
    | RunFinished
    | RankMessage
    | SystemMetrics
    | RanksSilent
)
Subscriber = Callable[[Event], None]


class EventSubscriber:
    """A subscriber with one method per kind of event, each doing nothing unless overridden (as
    Ray Train v2's callbacks): an event is dispatched once, here, by its type. The console, the
    text renderer, the widget and the view they fold the run into derive from it.

    A new event is a dataclass above, a member of :data:`Event`, its method here and its entry
    in ``_HANDLERS``; a subscriber that shows it overrides the method."""

    def __call__(self, event: Event) -> None:
        name = _HANDLERS.get(type(event))
        if name is not None:
            getattr(self, name)(event)

    def on_run_started(self, event: RunStarted) -> None: ...

    def on_run_queued(self, event: RunQueued) -> None: ...

    def on_run_waiting(self, event: RunWaiting) -> None: ...

    def on_run_scheduled(self, event: RunScheduled) -> None: ...

    def on_rank_started(self, event: RankStarted) -> None: ...

    def on_output_lines(self, event: OutputLines) -> None: ...

    def on_rank_finished(self, event: RankFinished) -> None: ...

    def on_run_finished(self, event: RunFinished) -> None: ...

    def on_rank_message(self, event: RankMessage) -> None: ...

    def on_system_metrics(self, event: SystemMetrics) -> None: ...

    def on_ranks_silent(self, event: RanksSilent) -> None: ...


_HANDLERS: dict[type, str] = {
    RunStarted: "on_run_started",
    RunQueued: "on_run_queued",
    RunWaiting: "on_run_waiting",
    RunScheduled: "on_run_scheduled",
    RankStarted: "on_rank_started",
    OutputLines: "on_output_lines",
    RankFinished: "on_rank_finished",
    RunFinished: "on_run_finished",
    RankMessage: "on_rank_message",
    SystemMetrics: "on_system_metrics",
    RanksSilent: "on_ranks_silent",
}
"""Each event type's method of :class:`EventSubscriber` (``tests/core/test_console.py`` checks
that every member of :data:`Event` has one)."""
