"""One way to become a rank: a process takes one call's ``RankSpec`` and runs its part of it,
the same on every backend (a rank forked by the launcher, standby or not, a session's rank, a
Ray actor).

:func:`run_call` is the whole of it: the prologue (:func:`enter`: title, environment, working
directory, ``sys.path``, seeds, the warm process group, ``runtime``'s channel), the function
(:func:`call_function`), and its outcome handed to the backend's :class:`Transport`, which is
all that differs: how the payload arrives, how messages and the outcome reach the caller.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import cloudpickle

from serverless_gpu.common import settings, sources
from serverless_gpu.common.errors import RAISED, FailureKind, exception_message
from serverless_gpu.common.proctitle import set_rank_title
from serverless_gpu.rank import runtime, seeding, stop_request, warm_group
from serverless_gpu.wire.protocol import ErrorRecord, RankSpec
from serverless_gpu.wire.runspec import RunSpec

Outcome = TypeVar("Outcome")
Payload = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Transport(ABC, Generic[Outcome]):
    """What a backend does its own way in a rank's call: the payload's way in, the caller's
    messages and the outcome's way out (``Outcome``: the launcher's rank returns its exit code,
    a Ray actor its answer)."""

    remote = False
    """The rank may run on another machine than the caller's: the caller's working directory and
    ``sys.path`` entries are taken where they exist, and the process keeps its own entries."""

    def kept_env(self, env: dict[str, str]) -> dict[str, str]:
        """Variables of the process's own that stay on top of the call's ``env``."""
        return {}

    def prepare(self) -> None:
        """Ready the process for the caller's requests (stacks, stop) before the warm group
        is settled, which may wait for the other ranks."""

    @abstractmethod
    def to_caller(self, kind: str, data: Any) -> None:
        """Send ``runtime.send_to_caller``'s message on its way."""

    def started(self) -> None:
        """The user's code starts now."""

    def ended(self) -> None:
        """The user's code has returned or raised: what it logged and its answer go next."""

    @abstractmethod
    def load(self) -> Payload:
        """The call's ``(fn, args, kwargs)``."""

    def note(self, exc: BaseException) -> str:
        """Words added to a raised exception's message (its cause, where the backend knows)."""
        return ""

    @abstractmethod
    def exited(self, exc: SystemExit) -> Outcome:
        """The function called ``sys.exit``."""

    @abstractmethod
    def failed(
        self, exc: BaseException, kind: FailureKind, type_name: str, message: str
    ) -> Outcome:
        """The call failed (``kind``): report it to the caller (``error_record``)."""

    @abstractmethod
    def hand_over(self, result: Any) -> Outcome:
        """The function returned ``result``: hand it to the caller."""


def run_call(spec: RankSpec, transport: Transport[Outcome]) -> Outcome:
    """The rank's part of the call ``spec``, from the prologue to its outcome."""
    enter(spec, transport)
    try:
        result = call_function(transport.load, transport.ended)
    except SystemExit as exc:
        return transport.exited(exc)
    except BaseException as exc:  # the user's failure, whatever it is, goes back to the caller
        message = exception_message(exc) + transport.note(exc)
        return transport.failed(exc, RAISED, qualified_type(exc), message)
    return transport.hand_over(result)


def enter(spec: RankSpec, transport: Transport[Any]) -> None:
    """Become rank ``spec.rank`` of the call: everything before the user's code."""
    run = spec.run
    env = spec.env()
    set_rank_title(spec.rank, run.world_size, run.name)
    # The call's environment only, never a previous call's (a Ray actor serves several).
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(transport.kept_env(env))
    _enter_folders(run, transport.remote)
    apply_thread_limit()
    seeding.reseed()
    stop_request.reset()
    transport.prepare()
    warm_group.settle(spec.warm_group, run.config.warm_process_group)
    runtime.connect(transport.to_caller)
    transport.started()


def _enter_folders(run: RunSpec, remote: bool) -> None:
    if not remote:
        os.chdir(run.cwd)
        sys.path[:] = list(run.sys_path)
        return
    if os.path.isdir(run.cwd):  # another node may not have the caller's folder
        os.chdir(run.cwd)
    caller = list(run.sys_path)
    sys.path[:] = [p for p in caller if not p or os.path.exists(p)] + [
        p for p in sys.path if p not in caller
    ]


def call_function(load: Callable[[], Payload], ended: Callable[[], None]) -> Any:
    """A rank's part of the call, on every backend: the hooks' rank initializers, the payload
    (``load()``), the user's function, ``ended()``, then the exit callbacks (metric flushes),
    whatever happens. Raises what the function raises."""
    try:
        _call_initializers()
        func, args, kwargs = load()
        return func(*args, **kwargs)
    except Exception as exc:
        _note_cpu_mode(exc)
        raise
    finally:
        best_effort(ended)
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


# -- failures, as the caller gets them ----------------------------------------------------------


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


def _user_traceback(exc: BaseException) -> str:
    """The rank's traceback from the user's first frame on: our frames say nothing to the
    user. Source lines of notebook cells come from the payload (``sources``)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _LIBRARY_FILES:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:  # a hostile exception must still be reported
        text = f"{type(exc).__qualname__}: {exception_message(exc)}\n"
    return sources.relabel(text)


def _pickled_exception(exc: BaseException) -> bytes | None:
    """The exception pickled, if it survives a round trip (custom ``__init__`` often does not)."""
    try:
        data = cloudpickle.dumps(exc)
        pickle.loads(data)
    except BaseException:  # unpicklable, or exits when loaded: the caller gets
        return None  # type, message and traceback text instead
    return data


def best_effort(action: Callable[..., Any], *args: Any) -> None:
    """One step of reporting a failure; a step that fails must not stop the next one."""
    try:
        action(*args)
    except Exception:  # e.g. EBADF on a closed stderr or socket
        pass


def exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def qualified_type(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"
