"""A persistent session's rank: the call's function is this loop, which runs cell after cell in
one namespace until the caller closes the session.

Cells come from the rank's FIFO, or from its TCP connection to a caller on another machine
(``wire/session.py``), read by a thread that also turns an
``Interrupt`` into SIGINT for the main thread while a cell runs (``signal.pthread_kill``:
a process-wide signal may land in another thread and would not wake a ``time.sleep``). Our
SIGINT handler raises ``KeyboardInterrupt`` only while the cell's own code runs, so a late
interrupt never lands in the middle of a message to the launcher.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import types
from pathlib import Path
from typing import Any

import cloudpickle

from serverless_gpu.common import settings, sources
from serverless_gpu.common.errors import RAISED, exception_message
from serverless_gpu.rank import event_route, runtime
from serverless_gpu.rank.become import error_record, hide_frames_of, qualified_type
from serverless_gpu.rank.session_group import GroupOwner, group_up
from serverless_gpu.runfiles.serialization import (
    dump_result,
    dumps_for_caller,
    load_payload,
    load_result,
)
from serverless_gpu.runfiles.streamed import read_message, streamed
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.session import (
    CELL_DONE,
    EXEC,
    GROUP_NOTE,
    PULL,
    PUSH,
    RUN,
    CellDone,
    CellRequest,
    CloseSession,
    Interrupt,
    Streamed,
    frame_parts,
    hello_bytes,
    session_fifo,
)

_INLINE_BYTES = 1 << 16
"""Values pickled smaller than this travel in the answer; larger ones (tensors) in a file."""

hide_frames_of(__file__)


class _Rank:
    def __init__(self, session_dir: str) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.session_dir = session_dir
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.running = 0
        """The cell whose code runs now (0: none)."""
        self.finished = 0
        """The last cell that ended."""
        self.cancelled: set[int] = set()
        """Cells interrupted before they started."""
        self.lock = threading.Lock()
        self.main = threading.main_thread().ident or 0
        self.group = GroupOwner(session_dir, self.rank, self.world, self.namespace)
        """The one owner of the rank's default process group (``rank/session_group.py``)."""

    # -- the reader thread -----------------------------------------------------------------

    def read(self, fd: int) -> None:
        while True:
            try:
                message = read_message(fd)  # a push: its tensors follow
            except (OSError, EOFError, pickle.UnpicklingError):
                message = None
            if isinstance(message, Interrupt):
                with self.lock:
                    if self.running == message.number:
                        signal.pthread_kill(self.main, signal.SIGINT)
                    elif message.number > self.finished:  # not started yet: at its start
                        self.cancelled.add(message.number)
                continue
            self.inbox.put(message)
            if message is None or isinstance(message, CloseSession):
                return

    def on_sigint(self, signum: int, frame: Any) -> None:
        if self.running:
            raise KeyboardInterrupt

    # -- the main thread -------------------------------------------------------------------

    def loop(self) -> None:
        while True:
            try:
                message = self.inbox.get()
            except KeyboardInterrupt:  # an interrupt that came after its cell ended
                continue
            if not isinstance(message, CellRequest):
                return  # closed, or the caller went away
            done = self.cell(message)
            runtime.run_cell_callbacks()
            runtime.send_to_caller(CELL_DONE, done)

    def cell(self, request: CellRequest) -> CellDone:
        try:
            if request.reform_group:
                self.reform(request.reform_group, request.reform_store)
            if request.fallback is not None:
                for name, value in pickle.loads(request.fallback).items():
                    self.namespace.setdefault(name, value)
            with self.lock:
                self.running = request.number
            try:
                if request.number in self.cancelled:
                    raise KeyboardInterrupt
                value = self.run(request)
            finally:
                with self.lock:
                    self.running = 0
                    self.finished = request.number
                    self.cancelled.discard(request.number)
            self.group.cell_ended(failed=False)
            return self.answer(request, value)
        except BaseException as exc:  # the cell's failure, whatever it is, goes to the caller
            self.running = 0
            return self.failed(request, exc)

    def failed(self, request: CellRequest, exc: BaseException) -> CellDone:
        """The cell's error; a group that was up is shut now (peers blocked in a collective
        raise) and the caller has every rank form the next generation before the next cell."""
        record = error_record(self.rank, exc, RAISED, qualified_type(exc), _message(exc))
        had_group = group_up()
        with contextlib.suppress(Exception):
            self.group.cell_ended(failed=True)
        return CellDone(request.number, error=record, group=had_group)

    def run(self, request: CellRequest) -> Any:
        kind, data, ns = request.kind, request.data, self.namespace
        if kind == EXEC:
            if request.filename:
                lines = str(data).splitlines(keepends=True)
                sources.install({request.filename: (request.label, lines)})
            return run_code(str(data), request.filename or "<session>", ns)
        if kind == RUN:
            fn, args, kwargs = load_payload(io.BytesIO(data))
            return with_namespace(fn, ns)(*args, **kwargs)
        if kind == PUSH:  # the values' file, or (a caller on another machine) the values
            ns.update(_pushed(data))
            return None
        if kind == PULL:
            if data not in ns:
                raise NameError(f"name {data!r} is not defined in rank {self.rank}'s session")
            return ns[data]
        raise ValueError(f"unknown cell kind {kind!r}")

    def answer(self, request: CellRequest, value: Any) -> CellDone:
        names = tuple(n for n in self.namespace if not n.startswith("__")) if self.rank == 0 else ()
        return CellDone(
            request.number,
            **self.encode(request, value),
            group=group_up(),
            names=names,
            peak_memory=_device_memory(),
        )

    def encode(self, request: CellRequest, value: Any) -> dict[str, Any]:
        """The answer's fields that carry ``value``: ``value``, ``streamed`` or ``value_file``."""
        if value is None:
            return {}
        if not request.results_dir:  # the caller's files are out of reach: all in the answer
            held = streamed(value)
            return {"streamed": held} if held else {"value": _pickled(value, dumps_for_caller)}
        if not _holds_tensors(value):
            data = _pickled(value, cloudpickle.dumps)
            if len(data) < _INLINE_BYTES:
                return {"value": data}
        path = Path(request.results_dir) / f"cell-{request.number:04d}-value_{self.rank}.pkl"
        dump_result(value, path, self.world)
        return {"value_file": str(path)}

    def reform(self, generation: int, store: str) -> None:
        """A new default group on the store of this generation: the broken one is gone."""
        self.group.reform(generation, store)
        held = self.group.held if self.rank == 0 else []
        if self.rank == 0:
            runtime.send_to_caller(GROUP_NOTE, (generation, tuple(held)))


def run_code(code: str, filename: str, ns: dict[str, Any]) -> Any:
    """Run ``code`` in ``ns``; the value of its last line when that is an expression."""
    tree = ast.parse(code, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), ns)
    if last is None:
        return None
    assert isinstance(last, ast.Expr)
    return eval(compile(ast.Expression(last.value), filename, "eval"), ns)


def with_namespace(fn: Any, ns: dict[str, Any]) -> Any:
    """``fn`` with the session's namespace as its globals: what it assigns with ``global``
    stays. The names it brought from the caller fill in what the namespace lacks."""
    if not isinstance(fn, types.FunctionType):
        return fn
    for name, value in fn.__globals__.items():
        if not name.startswith("__"):
            ns.setdefault(name, value)
    moved = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
    moved.__kwdefaults__ = fn.__kwdefaults__
    return moved


def _pushed(data: Any) -> dict[str, Any]:
    if isinstance(data, Streamed):
        return dict(data.value)
    if isinstance(data, bytes):
        return dict(pickle.loads(data))
    return dict(load_result(Path(data)))


def _pickled(value: Any, dumps: Any) -> bytes:
    try:
        return bytes(dumps(value))
    except Exception as exc:
        raise TypeError(
            f"the cell's value, a {qualified_type(value)}, cannot be pickled: "
            f"{exception_message(exc)}"
        ) from None


def _message(exc: BaseException) -> str:
    return exception_message(exc)


def _holds_tensors(value: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(isinstance(v, torch.Tensor) for v in value.values())
    if isinstance(value, list | tuple):
        return any(isinstance(v, torch.Tensor) for v in value)
    return False


def _device_memory() -> int:
    torch = sys.modules.get("torch")
    if torch is None or runtime.is_cpu_mode() or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.memory_allocated())


def serve() -> None:
    """The session's function in every rank: returns when the caller closes the session."""
    session_dir = str(RunPaths(Path(settings.RUN_DIR.read())).session)
    state = _Rank(session_dir)
    address = settings.SESSION_ADDRESS.read()
    link = _connect(address, state.rank) if address else None
    fd = link.fileno() if link else os.open(session_fifo(session_dir, state.rank), os.O_RDONLY)
    previous = signal.signal(signal.SIGINT, state.on_sigint)
    # Ray's workers block SIGINT: the main thread must take the interrupt it is sent
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    reader = threading.Thread(
        target=state.read, args=(fd,), name="serverless-gpu-session", daemon=True
    )
    reader.start()
    try:
        state.loop()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)  # a Ray actor serves later calls
        if link is not None:
            event_route.set_route(None)
            link.close()
        else:
            os.close(fd)


_CONNECT_S = 30.0


def _connect(address: str, rank: int) -> socket.socket:
    """The rank's connection to its caller, which then carries its events too (``event_route``):
    a cell's answer leaves after the cell's output, in one stream."""
    host, _, port = address.rpartition(":")
    link = socket.create_connection((host, int(port)), timeout=_CONNECT_S)
    link.settimeout(None)
    link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    link.sendall(hello_bytes(rank, settings.SESSION_TOKEN.read()))
    lock = threading.Lock()

    def send(batch: list[Any]) -> None:
        parts = frame_parts(batch)
        with lock:
            for part in parts:
                link.sendall(part)

    event_route.set_route(send)
    return link
