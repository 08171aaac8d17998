"""What a rank runs: forked from the launcher, it waits for its spec, runs the user's function once,
writes the result or an error record into the run directory and exits.

A rank never returns into the launcher's code: every path ends in ``os._exit``.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

import cloudpickle

from serverless_gpu.common import settings, sources
from serverless_gpu.common.describe import describe_value
from serverless_gpu.common.errors import (
    CONNECTION_LOST,
    RAISED,
    RESULT_NOT_WRITTEN,
    UNPICKLABLE_RESULT,
    FailureKind,
    exception_message,
)
from serverless_gpu.common.lifetime import die_with_parent
from serverless_gpu.common.proctitle import set_rank_title
from serverless_gpu.doctor import stacks
from serverless_gpu.rank import doctor as rank_doctor
from serverless_gpu.rank import runtime, seeding, warm_group
from serverless_gpu.runfiles.rundirs import storage_hint
from serverless_gpu.runfiles.serialization import (
    dump_result,
    dump_to_file,
    load_payload,
    partial_path,
)
from serverless_gpu.wire.protocol import (
    ErrorRecord,
    GroupReady,
    RankDone,
    RankSpec,
    Release,
    ToCaller,
    UserCodeStarted,
)
from serverless_gpu.wire.runspec import RunSpec


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
            code = _run(conn, spec)
    except (EOFError, OSError):
        code = 1  # the launcher went away before or during the call
    finally:
        _flush()
        os._exit(code)


def _write_result(result: Any, paths: list[Path], local_ranks: int) -> None:
    for path in paths[:-1]:
        try:
            dump_result(result, path, local_ranks)
            return
        except OSError:  # a full tmpfs (ENOSPC): the next place (the run directory) will do
            partial_path(path).unlink(missing_ok=True)
    dump_result(result, paths[-1], local_ranks)


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


def _run(conn: Connection, spec: RankSpec) -> int:
    run = spec.run
    set_rank_title(spec.rank, run.world_size, run.name)
    os.environ.clear()
    os.environ.update(spec.env())
    os.chdir(run.cwd)
    sys.path[:] = list(run.sys_path)
    apply_thread_limit()
    seeding.reseed()
    rank_doctor.install(run.paths, spec.rank)
    warm_group.settle(spec.warm_group, run.config.warm_process_group)
    send = _locked_sender(conn)
    runtime.connect(lambda kind, data: send(ToCaller(kind, data, time.time())))
    send(UserCodeStarted(time.time()))
    try:
        result = call_function(lambda: _read_payload(run.paths.payload))
    except SystemExit as exc:
        return exit_code(exc)
    except BaseException as exc:  # the user's failure, whatever it is, goes back to the caller
        message = exception_message(exc) + _closed_connection(exc, conn)
        return _report_error(spec, send, exc, RAISED, qualified_type(exc), message)
    try:
        _write_result(result, run.paths.results(spec.rank), run.world_size)
    except OSError as exc:  # no room left anywhere: say so, not "cannot be pickled"
        return _report_error(
            spec, send, exc, RESULT_NOT_WRITTEN, qualified_type(result), _not_written(exc, run)
        )
    except Exception as exc:  # any pickling failure: report which rank and which type
        return _report_error(
            spec, send, exc, UNPICKLABLE_RESULT, qualified_type(result), exception_message(exc)
        )
    try:
        send(RankDone(ok=True, time=time.time(), summary=describe_value(result)))
    except OSError as exc:  # the function closed our connection: the result cannot be announced
        return _report_error(spec, send, exc, CONNECTION_LOST, qualified_type(result), "")
    _flush()
    try:
        while not isinstance(conn.recv(), Release):
            pass
    except (EOFError, OSError):
        pass
    # The result is on its way: communicators are shut down now, outside the call's time.
    warm_group.finish()
    return 0


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


def _read_payload(path: Path) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    with open(path, "rb") as f:
        return load_payload(f)


def call_function(
    load: Callable[[], tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]],
) -> Any:
    """A rank's part of the call, on every backend: the hooks' rank initializers, the payload
    (``load()``), the user's function, then the exit callbacks (metric flushes), whatever
    happens. Raises what the function raises."""
    try:
        _call_initializers()
        func, args, kwargs = load()
        return func(*args, **kwargs)
    except Exception as exc:
        _note_cpu_mode(exc)
        raise
    finally:
        _exit_callbacks_quietly()


_GPU_ONLY_FAILURES = (
    "_cuda_setDevice",  # torch.cuda.set_device on a torch built without CUDA
    "Torch not compiled with CUDA",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    "have NCCL built in",  # init_process_group("nccl") on a torch built without NCCL
)
CPU_MODE_NOTE = (
    "this rank runs in CPU mode, without CUDA or NCCL: use serverless_gpu.runtime.device() "
    "for the device and runtime.init_process_group() (gloo in CPU mode, nccl on GPUs) in place "
    'of torch.cuda.set_device(...) and init_process_group("nccl"), and the code runs in both'
)


def _note_cpu_mode(exc: Exception) -> None:
    """GPU-only code (the SimpleMLP of many tutorials) run in CPU mode fails deep in torch:
    say why, and what runs in both modes, on the exception itself (its type stays torch's)."""
    gpu_only = any(m in exception_message(exc) for m in _GPU_ONLY_FAILURES)
    if gpu_only and runtime.is_cpu_mode() and hasattr(exc, "add_note"):  # Python 3.11+
        best_effort(exc.add_note, CPU_MODE_NOTE)


def error_record(
    rank: int, exc: BaseException, kind: FailureKind, type_name: str, message: str
) -> ErrorRecord:
    """A rank's failure as the caller turns it into an exception: for ``RAISED`` the exception
    itself when it pickles, and always its type, message and traceback from the user's code."""
    return ErrorRecord(
        rank=rank,
        time=time.time(),
        type_name=type_name,
        message=message,
        traceback_text=_user_traceback(exc),
        kind=kind,
        exception=_pickled_exception(exc) if kind == RAISED else None,
    )


def hide_frames_of(filename: str) -> None:
    """Frames of this file (a backend's rank code) lead a rank's traceback before the user's
    code: leave them out of the traceback the caller shows."""
    _LIBRARY_FILES.add(filename)


_LIBRARY_FILES = {__file__}


def _report_error(
    spec: RankSpec,
    send: Callable[[Any], None],
    exc: BaseException,
    kind: FailureKind,
    type_name: str,
    message: str,
) -> int:
    """Record a failure for the caller. The record goes first, then the launcher is told, and
    the traceback is logged last: a function that closed stdout, stderr or the connection to
    the launcher must not lose its error to a failed write."""
    record = error_record(spec.rank, exc, kind, type_name, message)
    tb_text = record.traceback_text
    failure = record.failure
    best_effort(dump_to_file, record, spec.run.paths.error(spec.rank))
    best_effort(send, RankDone(ok=False, time=record.time, summary=failure.detail, failure=failure))
    best_effort(sys.stderr.write, tb_text)
    return 1


def best_effort(action: Callable[..., Any], *args: Any) -> None:
    """One step of reporting a failure; a step that fails must not stop the next one."""
    try:
        action(*args)
    except Exception:  # e.g. EBADF on a closed stderr or socket
        pass


def _user_traceback(exc: BaseException) -> str:
    """The rank's traceback from the user's first frame on: this module's frames say nothing
    to the user. Source lines of notebook cells come from the payload (``sources``)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _LIBRARY_FILES:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:  # a hostile exception must still be reported
        text = f"{type(exc).__qualname__}: {exception_message(exc)}\n"
    return sources.relabel(text)


def _locked_sender(conn: Connection) -> Callable[[Any], None]:
    """Rank-side helpers (a metrics thread) may send concurrently with the main thread."""
    lock = threading.Lock()

    def send(message: Any) -> None:
        with lock:
            conn.send(message)

    return send


def _call_initializers() -> None:
    """Run the hooks' ``module:function`` initializers named in the rank's environment."""
    for name in filter(None, settings.RANK_INIT.read().split(",")):
        module, _, attr = name.partition(":")
        getattr(importlib.import_module(module), attr)()


def _exit_callbacks_quietly() -> None:
    try:
        runtime.run_exit_callbacks()
    except Exception:  # a failing flush must not hide the user's own result or error
        best_effort(traceback.print_exc)  # nor may stderr, if the function closed it


def apply_thread_limit() -> None:
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))


def exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def qualified_type(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _pickled_exception(exc: BaseException) -> bytes | None:
    """The exception pickled, if it survives a round trip (custom ``__init__`` often does not)."""
    try:
        data = cloudpickle.dumps(exc)
        pickle.loads(data)
    except BaseException:  # unpicklable, or exits when loaded: the caller gets
        return None  # type, message and traceback text instead
    return data


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
