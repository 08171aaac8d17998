"""Every error the library raises itself derives from :class:`DistributedError`.

A rank's own exception is re-raised with its original type (see :func:`attach_remote_context`);
the classes here cover what the library detects: bad configuration, serialization, crashed
ranks, timeouts and cancellation.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class DistributedError(Exception):
    """Base class of every error raised by serverless_gpu itself."""

    run_dir: Path | None = None
    rank: int | None = None
    """The rank whose failure this is (the run's root cause), None for the run as a whole."""
    failures: tuple[RankFailure, ...] = ()
    """Every rank's own failure in the run, first in time first (torch elastic's "other
    failures"); ranks the library stopped are not among them. See :func:`failures_of`."""

    def __init__(self, message: str, *, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir

    def __str__(self) -> str:
        return super().__str__() + other_failures_text(self.failures, self.rank)


class CallerError(DistributedError):
    """The call itself is at fault (its configuration, arguments, function or time limit):
    changing the call fixes it. A base class only; the original API's
    ``ServerlessGpuCustomerError`` (:mod:`serverless_gpu.exceptions`)."""


class InternalError(DistributedError):
    """The library's own machinery failed (its launcher process), not the call's code. A base
    class only; the original API's ``ServerlessGpuInternalError``."""


class ConfigurationError(CallerError, ValueError):
    """A decorator or call argument is invalid; raised before anything is launched."""


class GPUConfigError(ConfigurationError):
    """The requested GPUs (count or type) do not match what this machine has."""


class UsageError(CallerError, TypeError):
    """The API was used in a way it does not support (e.g. calling the decorated object)."""


class SerializationError(CallerError):
    """The function, its arguments, a result or an exception could not be pickled."""

    @classmethod
    def result_not_loaded(
        cls, rank: int, exc: BaseException, *, run_dir: Path | None
    ) -> SerializationError:
        """A rank's result that the caller cannot unpickle (its class cannot be imported
        here, most often); raise it ``from exc``."""
        return cls(
            f"the result of rank {rank} could not be loaded in the caller: "
            f"{type(exc).__name__}: {exc}",
            run_dir=run_dir,
        )


class PayloadTooLargeError(SerializationError):
    """The pickled function and arguments exceed the configured size limit."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit
        """The limit in bytes; pickling stopped as soon as it was passed."""


class StorageError(DistributedError, OSError):
    """A file of the run could not be written (no space left, a file-size limit, a read-only
    folder); ``errno`` and ``filename`` are those of the underlying ``OSError``."""

    @classmethod
    def wrap(
        cls, what: str, exc: OSError, hint: str = "", *, run_dir: Path | None = None
    ) -> StorageError:
        """``"<what>: No space left on device (<file>). <hint>"``."""
        where = f" ({exc.filename})" if exc.filename else ""
        err = cls(f"{what}: {exc.strerror or exc}{where}. {hint}".rstrip(), run_dir=run_dir)
        err.errno, err.strerror, err.filename = exc.errno, exc.strerror, exc.filename
        return err

    def __str__(self) -> str:
        # OSError's own would read "[Errno 28] No space left on device: None", without the
        # message that says which file of the run and what to do.
        text = str(self.args[0]) if self.args else OSError.__str__(self)
        return text + other_failures_text(self.failures, self.rank)


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


def timeout_sentence(timeout: float, running: Sequence[int]) -> str:
    """How a run that ran past its time limit is worded, wherever it is shown."""
    ranks = ", ".join(str(r) for r in running) or "none"
    return f"exceeded its timeout of {timeout:g} s; ranks still running: {ranks}"


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


class RankFailedError(DistributedError):
    """A rank crashed, was killed by a signal, exited non-zero or exited without returning."""

    def __init__(
        self,
        failure: RankFailure,
        *,
        run_dir: Path | None = None,
    ) -> None:
        text = f"rank {failure.rank} {failure.message}"
        if failure.log_path is not None:
            text += f"\nfull log: {failure.log_path}"
        if failure.stderr_tail:
            text += f"\nlast lines of rank {failure.rank}'s stderr:\n{failure.stderr_tail}"
        super().__init__(text, run_dir=run_dir)
        self.failure = failure
        self.rank: int | None = failure.rank
        self.exit_code = failure.exit_code
        self.signal_name = failure.signal_name


class RemoteError(DistributedError):
    """A rank raised an exception that could not be pickled; its type, message and traceback."""

    def __init__(
        self, rank: int, type_name: str, message: str, traceback_text: str, *, run_dir: Path | None
    ) -> None:
        super().__init__(
            f"rank {rank} {describe_failure(RAISED, type_name, message)}", run_dir=run_dir
        )
        self.rank = rank
        self.type_name = type_name
        self.remote_message = message
        self.remote_traceback = traceback_text


class DistributedTimeoutError(CallerError, TimeoutError):
    """The call ran past its ``timeout``; every rank was killed."""

    def __init__(
        self,
        timeout: float,
        running_ranks: tuple[int, ...],
        *,
        run_dir: Path | None,
        stacks: dict[int, str] | None = None,
        where: dict[int, str] | None = None,
        stacks_dir: Path | None = None,
    ) -> None:
        text = f"distributed call {timeout_sentence(timeout, running_ranks)}"
        if where:
            text += "\nwhere each rank was (main thread) when the timeout struck:"
            text += "".join(f"\n  rank {r}: {line}" for r, line in sorted(where.items()))
        if stacks and stacks_dir is not None:
            text += f"\nevery thread's stack: the error's .stacks, and {stacks_dir}"
        super().__init__(text, run_dir=run_dir)
        self.timeout = timeout
        self.running_ranks = running_ranks
        self.stacks: dict[int, str] = dict(stacks or {})
        """Each rank's stacks (faulthandler's text, every thread) taken before it was stopped."""


class WaitTimeoutError(DistributedError, TimeoutError):
    """``RunHandle.result(timeout=...)`` gave up waiting; the run itself goes on."""


class CancelledError(DistributedError):
    """The run was cancelled (Cancel button or :meth:`RunHandle.cancel`); every rank was killed."""


class LauncherError(InternalError):
    """The launcher process could not be started or died unexpectedly."""


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the ``__cause__`` of the re-raised exception.

    The same device ``concurrent.futures.process`` uses: the traceback text is printed by
    Python's normal traceback machinery as "The above exception was the direct cause ...".
    """

    def __init__(self, rank: int, traceback_text: str) -> None:
        super().__init__(traceback_text)
        self.rank = rank
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f'\n"""\nTraceback from rank {self.rank}:\n{self.traceback_text}"""'


def attach_remote_context(
    exc: BaseException, rank: int, traceback_text: str, run_dir: Path | None
) -> BaseException:
    """Label a rank's original exception with its rank, remote traceback and run directory."""
    exc.__cause__ = RemoteTraceback(rank, traceback_text)
    note = f"raised on rank {rank}" + (f" (run directory: {run_dir})" if run_dir else "")
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    for name, value in (("rank", rank), ("run_dir", run_dir)):
        try:
            setattr(exc, f"serverless_gpu_{name}", value)
        except (AttributeError, TypeError):  # exceptions with __slots__ refuse attributes
            pass
    return exc


def with_failures(exc: BaseException, failures: Sequence[RankFailure]) -> BaseException:
    """Put every rank's failure on the exception the caller raises: the library's errors show
    the others in their message, a rank's own exception in a note."""
    failures = tuple(failures)
    if isinstance(exc, DistributedError):
        exc.failures = failures
        return exc
    others = other_failures_text(failures, rank_of(exc)).strip()
    if others and hasattr(exc, "add_note"):
        exc.add_note(others)
    try:
        exc.serverless_gpu_failures = failures  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # exceptions with __slots__ refuse attributes
        pass
    return exc


def rank_of(exc: BaseException) -> int | None:
    """The rank a run's exception comes from (its root cause), None for the run as a whole:
    the library's errors and a rank's own exception, re-raised with its type, alike."""
    if isinstance(exc, DistributedError):
        return exc.rank
    rank = getattr(exc, "serverless_gpu_rank", None)
    return rank if isinstance(rank, int) else None


def run_dir_of(exc: BaseException) -> Path | None:
    """The run directory (logs, stacks, error records) of the run an exception comes from."""
    if isinstance(exc, DistributedError):
        return exc.run_dir
    run_dir = getattr(exc, "serverless_gpu_run_dir", None)
    return run_dir if isinstance(run_dir, Path) else None


def failures_of(exc: BaseException) -> tuple[RankFailure, ...]:
    """Every rank's own failure in the run an exception comes from, first in time first."""
    if isinstance(exc, DistributedError):
        return exc.failures
    failures = getattr(exc, "serverless_gpu_failures", ())
    return tuple(failures) if isinstance(failures, tuple) else ()
