"""What a rank runs: forked from the launcher, it waits for its spec, runs the user's function once
(``become.run_call``), writes the result or an error record into the run directory and exits.

A rank never returns into the launcher's code: every path ends in ``os._exit``.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from serverless_gpu.common.describe import describe_value
from serverless_gpu.common.errors import (
    CONNECTION_LOST,
    RESULT_NOT_WRITTEN,
    UNPICKLABLE_RESULT,
    FailureKind,
    exception_message,
)
from serverless_gpu.common.lifetime import die_with_parent
from serverless_gpu.doctor import stacks
from serverless_gpu.rank import doctor as rank_doctor
from serverless_gpu.rank import runtime, stop_signal, warm_group
from serverless_gpu.rank.become import (
    Payload,
    Transport,
    best_effort,
    error_record,
    exit_code,
    hide_frames_of,
    qualified_type,
    run_call,
)
from serverless_gpu.runfiles.rundirs import storage_hint
from serverless_gpu.runfiles.serialization import (
    dump_result,
    dump_to_file,
    load_payload,
    partial_path,
)
from serverless_gpu.wire.protocol import (
    GroupReady,
    RankDone,
    RankSpec,
    Release,
    ToCaller,
    UserCodeEnded,
    UserCodeStarted,
)
from serverless_gpu.wire.runspec import RunSpec

hide_frames_of(__file__)


def rank_main(
    conn: Connection,
    stdout_fd: int,
    stderr_fd: int,
    warm_gpu: int | None,
    plan: warm_group.GroupPlan | None = None,
) -> NoReturn:
    """Entry point of a freshly forked rank process: a standby rank first creates its CUDA
    context on GPU ``warm_gpu`` and forms its process group (``plan``)."""
    code = 70  # EX_SOFTWARE: reached only if the code below itself breaks
    try:
        keep = {conn.fileno()}
        if plan is not None and plan.listen_fd is not None:
            keep.add(plan.listen_fd)
        _become_rank_process(stdout_fd, stderr_fd, keep)
        if warm_gpu is not None:
            _create_cuda_context(warm_gpu)
        if plan is not None:
            conn.send(GroupReady(warm_group.form(plan)))
        spec = conn.recv()
        if isinstance(spec, RankSpec):
            code = run_call(spec, LauncherTransport(conn, spec))
    except (EOFError, OSError):
        code = 1  # the launcher went away before or during the call
    finally:
        _flush()
        os._exit(code)


def _become_rank_process(stdout_fd: int, stderr_fd: int, keep: set[int]) -> None:
    # Own process group (the launcher sets it too, race-free): killing the group also ends
    # whatever the rank started, such as DataLoader workers.
    os.setpgid(0, 0)
    die_with_parent(signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The doctor's signals stay blocked in every thread (threads inherit the mask): only the
    # doctor thread takes them, with sigwait.
    signal.pthread_sigmask(signal.SIG_SETMASK, stacks.DOCTOR_SIGNALS)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    # Drop every descriptor inherited from the launcher (other ranks' pipes, the caller's socket).
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _line_stream(1)
    sys.stderr = _line_stream(2)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def _line_stream(fd: int) -> io.TextIOWrapper:
    raw = open(fd, "wb", buffering=0, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _create_cuda_context(index: int) -> None:
    import torch

    torch.cuda.set_device(index)
    torch.empty(1, device=f"cuda:{index}")


class LauncherTransport(Transport[int]):
    """A forked rank's call: the payload from the run directory, messages over the launcher's
    socket, the result or error record into files; the outcome is the process's exit code."""

    def __init__(self, conn: Connection, spec: RankSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.send = _locked_sender(conn)

    def prepare(self) -> None:
        rank_doctor.install(self.spec.run.paths, self.spec.rank)
        # Once something is to be sent at a stop (a tracked call), a SIGTERM sends it first.
        runtime.when_stopped_wanted(stop_signal.install)

    def to_caller(self, kind: str, data: Any) -> None:
        self.send(ToCaller(kind, data, time.time()))

    def started(self) -> None:
        self.send(UserCodeStarted(time.time()))

    def ended(self) -> None:
        self.send(UserCodeEnded(time.time()))

    def load(self) -> Payload:
        with open(self.spec.run.paths.payload, "rb") as f:
            return load_payload(f)

    def note(self, exc: BaseException) -> str:
        return _closed_connection(exc, self.conn)

    def exited(self, exc: SystemExit) -> int:
        return exit_code(exc)

    def failed(self, exc: BaseException, kind: FailureKind, type_name: str, message: str) -> int:
        """Record a failure for the caller. The record goes first, then the launcher is told,
        and the traceback is logged last: a function that closed stdout, stderr or the
        connection to the launcher must not lose its error to a failed write."""
        spec = self.spec
        record = error_record(spec.rank, exc, kind, type_name, message)
        failure = record.failure
        best_effort(dump_to_file, record, spec.run.paths.error(spec.rank))
        done = RankDone(ok=False, time=record.time, summary=failure.detail, failure=failure)
        best_effort(self.send, done)
        best_effort(sys.stderr.write, record.traceback_text)
        return 1

    def hand_over(self, result: Any) -> int:
        run = self.spec.run
        try:
            _write_result(result, run.paths.results(self.spec.rank), run.world_size)
        except OSError as exc:  # no room left anywhere: say so, not "cannot be pickled"
            return self.failed(
                exc, RESULT_NOT_WRITTEN, qualified_type(result), _not_written(exc, run)
            )
        except Exception as exc:  # any pickling failure: report which rank and which type
            return self.failed(
                exc, UNPICKLABLE_RESULT, qualified_type(result), exception_message(exc)
            )
        try:
            self.send(RankDone(ok=True, time=time.time(), summary=describe_value(result)))
        except OSError as exc:  # the function closed our connection: the result cannot be announced
            return self.failed(exc, CONNECTION_LOST, qualified_type(result), "")
        _flush()
        self._wait_for_release()
        # The result is on its way: communicators are shut down now, outside the call's time.
        warm_group.finish()
        return 0

    def _wait_for_release(self) -> None:
        try:
            while not isinstance(self.conn.recv(), Release):
                pass
        except (EOFError, OSError):
            pass


def _write_result(result: Any, paths: list[Path], local_ranks: int) -> None:
    for path in paths[:-1]:
        try:
            dump_result(result, path, local_ranks)
            return
        except OSError:  # a full tmpfs (ENOSPC): the next place (the run directory) will do
            partial_path(path).unlink(missing_ok=True)
    dump_result(result, paths[-1], local_ranks)


CLOSED_CONNECTION_NOTE = (
    "the function closed file descriptors it did not open (os.closerange or the like), among "
    "them this rank's connection to the launcher: close only the descriptors your code opened"
)


def _closed_connection(exc: BaseException, conn: Connection) -> str:
    """A function that closed our descriptors fails later on one of them (EBADF, from
    ``send_to_caller`` or a metric): the cause, said after the error's words and on the
    exception itself (its type stays); "" for any other error."""
    if not (isinstance(exc, OSError) and exc.errno == errno.EBADF):
        return ""
    try:
        os.fstat(conn.fileno())
        return ""  # the connection is intact: the EBADF is of the function's own making
    except (OSError, ValueError):
        pass
    if hasattr(exc, "add_note"):  # Python 3.11+
        best_effort(exc.add_note, CLOSED_CONNECTION_NOTE)
    return f" ({CLOSED_CONNECTION_NOTE})"


def _not_written(exc: OSError, run: RunSpec) -> str:
    """Why the result could not be written, and what to do, in one line."""
    where = f" ({exc.filename})" if exc.filename else ""
    hint = storage_hint(run.paths.run_dir.parent, exc.errno)
    return f"{exc.strerror or exception_message(exc)}{where}. {hint}"


def _locked_sender(conn: Connection) -> Callable[[Any], None]:
    """Rank-side helpers (a metrics thread) may send concurrently with the main thread."""
    lock = threading.Lock()

    def send(message: Any) -> None:
        with lock:
            conn.send(message)

    return send


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
