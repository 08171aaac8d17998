"""Every error the library raises itself derives from :class:`DistributedError`.

A rank's own exception is re-raised with its original type (see :func:`attach_remote_context`);
the classes here cover what the library detects: bad configuration, serialization, crashed
ranks, timeouts and cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class DistributedError(Exception):
    """Base class of every error raised by serverless_gpu itself."""

    run_dir: Path | None = None

    def __init__(self, message: str, *, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


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
        return str(self.args[0]) if self.args else OSError.__str__(self)


RAISED = "raised"
UNPICKLABLE_RESULT = "unpicklable_result"
RESULT_NOT_WRITTEN = "result_not_written"
CONNECTION_LOST = "connection_lost"
"""Kinds of rank failure the rank itself reports (``ErrorRecord.kind``)."""

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


def root_cause(failures: list[tuple[float, int, str]]) -> tuple[float, int, str] | None:
    """The run's root cause among ``(time, rank, what)`` failures: the first in time, except
    that a rank whose collective lost its peer comes after any other kind of failure. The peer
    that crashed ended before that error, but its exit is seen (and timed) by the launcher only
    when it gets to it, which on a busy machine is after the survivor's error was recorded."""
    if not failures:
        return None
    return min(failures, key=lambda f: (any(w in f[2].lower() for w in PEER_LOST_WORDS), f))


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
    """What is known about one rank that failed (the torch elastic ``ProcessFailure`` idea)."""

    rank: int
    """Global rank of the process."""
    time: float
    """Wall-clock time at which the failure happened (or was observed)."""
    exit_code: int | None
    """Exit status of the process, ``None`` while unknown; negative when killed by a signal."""
    signal_name: str | None
    """Name of the signal that killed the process (``"SIGSEGV"``), if any."""
    message: str
    """One-line description of the failure."""
    log_path: Path | None = None
    """The rank's full log on disk."""
    stderr_tail: str = ""
    """The last lines the rank wrote to stderr."""


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
        self.rank = failure.rank
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
        ranks = ", ".join(str(r) for r in running_ranks) or "none"
        text = (
            f"distributed call exceeded its timeout of {timeout:g} s; ranks still running: {ranks}"
        )
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
