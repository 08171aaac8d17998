"""One rank's failure, worded once: how it failed (:class:`FailureKind`), what it reads as after
``rank N`` (:func:`describe_failure`, :func:`exit_words`), the run's root cause among several
(:func:`root_cause`) and the "other failures" line. The console, the widget, MLflow and the
exceptions of :mod:`serverless_gpu.common.errors` (which re-exports every name here) read these.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class FailureKind(str, enum.Enum):
    """How a rank failed: what the rank reported itself (the first four, ``ErrorRecord.kind``)
    or how its process ended, as the launcher or the Ray backend saw it (the rest)."""

    RAISED = "raised"
    """The user's function raised."""
    UNPICKLABLE_RESULT = "unpicklable_result"
    RESULT_NOT_WRITTEN = "result_not_written"
    CONNECTION_LOST = "connection_lost"
    """The function returned, but closed the rank's connection to the launcher."""
    KILLED = "killed"
    """Its process was killed by a signal."""
    EXITED = "exited"
    """Its process exited (with a non-zero code, or with 0 before returning a result)."""
    LOST = "lost"
    """Its Ray actor died, or the node it ran on."""

    def __str__(self) -> str:
        return self.value


RAISED = FailureKind.RAISED
UNPICKLABLE_RESULT = FailureKind.UNPICKLABLE_RESULT
RESULT_NOT_WRITTEN = FailureKind.RESULT_NOT_WRITTEN
CONNECTION_LOST = FailureKind.CONNECTION_LOST

STR_FAILED = "<exception str() failed>"
"""The message of an exception whose ``__str__`` raised (the wording ``traceback`` uses)."""


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, or :data:`STR_FAILED` when the exception's own ``__str__`` raises."""
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not lose the exception it belongs to
        return STR_FAILED


# What a rank's collective raises when a peer went away: a consequence of another rank's end.
PEER_LOST_WORDS = ("connection closed by peer", "connection reset by peer")


def root_cause(failures: Sequence[RankFailure]) -> RankFailure | None:
    """The run's root cause among its ranks' failures: the first in time, except that a rank
    whose collective lost its peer comes after any other kind of failure. The peer that
    crashed ended before that error, but its exit is seen (and timed) by the launcher only when
    it gets to it, which on a busy machine is after the survivor's error was recorded."""
    if not failures:
        return None
    return min(failures, key=lambda f: (f.peer_lost, f.time, f.rank))


def signal_name(status: int) -> str | None:
    """``-11`` (a Popen-style return code) -> ``"SIGSEGV"``."""
    if status >= 0:
        return None
    try:
        return signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"


def exit_words(status: int) -> str:
    """How a process's end reads after its name: ``"was killed by SIGSEGV"``,
    ``"exited with code 3"`` (a Popen-style return code)."""
    sig = signal_name(status)
    return f"was killed by {sig}" if sig is not None else f"exited with code {status}"


def describe_failure(kind: str, type_name: str, message: str) -> str:
    """A rank's failure as it reads after ``rank N``: worded here once, for the console, the
    widget, MLflow and the exception the caller raises."""
    lines = message.strip().splitlines()
    first = lines[0] if lines else ""
    if kind == UNPICKLABLE_RESULT:
        return f"returned a {type_name} that cannot be pickled: {first}"
    if kind == RESULT_NOT_WRITTEN:
        return f"returned a {type_name} that could not be written for the caller: {first}"
    if kind == CONNECTION_LOST:
        return (
            "returned, but its connection to the launcher was closed (the function closed "
            "file descriptors it did not open); its result cannot be delivered"
        )
    return f"raised {describe_exception(type_name, message)}"


def describe_exception(type_name: str, message: str) -> str:
    """``"ValueError: first line of the message"`` (the type without its module)."""
    lines = message.strip().splitlines()
    short = type_name.rsplit(".", 1)[-1]
    return f"{short}: {lines[0]}" if lines else short


@dataclass(frozen=True)
class RankFailure:
    """What is known about one rank that failed (the torch elastic ``ProcessFailure`` idea).
    Made by the named constructors, which word it; every renderer reads these fields."""

    rank: int
    """Global rank of the process."""
    time: float
    """Wall-clock time at which the failure happened (or was observed)."""
    exit_code: int | None
    """Exit status of the process, ``None`` while unknown; negative when killed by a signal."""
    signal_name: str | None
    """Name of the signal that killed the process (``"SIGSEGV"``), if any."""
    message: str
    """One-line description of the failure as it reads after ``rank N``
    (``"raised ValueError: x"``, ``"was killed by SIGSEGV"``)."""
    log_path: Path | None = None
    """The rank's full log on disk."""
    stderr_tail: str = ""
    """The last lines the rank wrote to stderr."""
    kind: FailureKind = FailureKind.EXITED
    detail: str = ""
    """The failure in a rank's row, where the row names the rank: the exception
    (``"ValueError: x"``) for a raise, else ``message``."""

    @classmethod
    def reported(
        cls, rank: int, time: float, kind: str, type_name: str, message: str
    ) -> RankFailure:
        """A failure the rank reported itself (its ``ErrorRecord``)."""
        what = describe_failure(kind, type_name, message)
        detail = describe_exception(type_name, message) if kind == RAISED else what
        return cls(rank, time, None, None, what, kind=FailureKind(kind), detail=detail)

    @classmethod
    def of_exit(cls, rank: int, time: float, status: int) -> RankFailure:
        """A rank whose process ended on its own while it ran its call."""
        sig = signal_name(status)
        if status == 0:
            what = "exited with code 0 without returning a result"
        else:
            what = exit_words(status)
        kind = FailureKind.KILLED if sig is not None else FailureKind.EXITED
        return cls(rank, time, status, sig, what, kind=kind, detail=what)

    @classmethod
    def lost(cls, rank: int, time: float, what: str) -> RankFailure:
        """A rank whose Ray actor died under it (``what``: how, after ``rank N``)."""
        return cls(rank, time, None, None, what, kind=FailureKind.LOST, detail=what)

    @property
    def text(self) -> str:
        """``"rank 2 raised ValueError: x"``."""
        return f"rank {self.rank} {self.message}"

    @property
    def peer_lost(self) -> bool:
        """A rank's collective that lost its peer: a consequence of another rank's end."""
        return self.kind is FailureKind.RAISED and any(
            w in self.message.lower() for w in PEER_LOST_WORDS
        )


def other_failures_text(failures: Sequence[RankFailure], rank: int | None) -> str:
    """``"\nother failures: rank 2 was killed by SIGKILL; rank 3 ..."``: every failure but
    the one of ``rank`` (the error's own), empty when there is none."""
    others = [f.text for f in failures if f.rank != rank]
    return f"\nother failures: {'; '.join(others)}" if others else ""
