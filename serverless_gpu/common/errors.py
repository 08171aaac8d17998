"""Every error the library raises itself derives from :class:`DistributedError`.

A rank's own exception is re-raised with its original type (see :func:`attach_remote_context`);
the classes here cover what the library detects: bad configuration, serialization, crashed
ranks, timeouts and cancellation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# A rank's failure and its words live in failures.py; they stay importable from here.
from serverless_gpu.common.failures import CONNECTION_LOST as CONNECTION_LOST
from serverless_gpu.common.failures import PEER_LOST_WORDS as PEER_LOST_WORDS
from serverless_gpu.common.failures import RAISED as RAISED
from serverless_gpu.common.failures import RESULT_NOT_WRITTEN as RESULT_NOT_WRITTEN
from serverless_gpu.common.failures import STR_FAILED as STR_FAILED
from serverless_gpu.common.failures import UNPICKLABLE_RESULT as UNPICKLABLE_RESULT
from serverless_gpu.common.failures import FailureKind as FailureKind
from serverless_gpu.common.failures import RankFailure as RankFailure
from serverless_gpu.common.failures import describe_exception as describe_exception
from serverless_gpu.common.failures import describe_failure as describe_failure
from serverless_gpu.common.failures import exception_message as exception_message
from serverless_gpu.common.failures import exit_words as exit_words
from serverless_gpu.common.failures import other_failures_text as other_failures_text
from serverless_gpu.common.failures import root_cause as root_cause
from serverless_gpu.common.failures import signal_name as signal_name
from serverless_gpu.common.timeout_words import timeout_sentence


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
        starting: tuple[int, ...] = (),
        stacks: dict[int, str] | None = None,
        where: dict[int, str] | None = None,
        stacks_dir: Path | None = None,
    ) -> None:
        text = f"distributed call {timeout_sentence(timeout, running_ranks, starting)}"
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
