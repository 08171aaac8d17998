"""One rank on a Ray node: an actor that captures its process's output, becomes the rank of each
call it receives (a ``RayRankSpec``) as every rank does (``rank/become.py``), runs the user's
function and hands back the result (a file in the caller's results twin on the caller's machine,
else through Ray's object store: ``results.py``) or the failure's error record; after a
call that succeeded it stays for the next call of its set (``standby.py``).

The function runs on the actor's main thread, as a local rank runs it; output is read by two
threads and sent, with the rank's messages, to the set's event sink every 0.1 s, or, in a
session's rank, at once through its connection to the caller (``rank/event_route.py``): a cell's
end (a ``CellEnd``) leaves after the cell's output.
"""

from __future__ import annotations

import faulthandler
import fcntl
import io
import os
import select
import socket
import struct
import sys
import tempfile
import termios
import threading
import time
from collections import deque
from typing import Any

from serverless_gpu.backends.ray import doctor, results
from serverless_gpu.backends.ray.doctor import FLUSH, STACKS, STOP
from serverless_gpu.backends.ray.rank_spec import RayRankSpec
from serverless_gpu.common.describe import describe_value
from serverless_gpu.common.errors import (
    RAISED,
    UNPICKLABLE_RESULT,
    FailureKind,
    exception_message,
)
from serverless_gpu.common.output import LineSplitter
from serverless_gpu.rank import become, event_route, runtime, stop_request, warm_group
from serverless_gpu.runfiles.serialization import load_payload
from serverless_gpu.wire.events import CellEnd, Event, OutputLines, RankMessage

become.hide_frames_of(__file__)
_FLUSH_S = 0.1
_DRAIN_S = 2.0
NODE_LOCAL_ENV = ("CUDA_VISIBLE_DEVICES",)
"""Variables a rank keeps from its node (Ray sets them per actor) unless the call sets them;
Ray's own ``RAY_*`` variables are always the node's."""


class OutputCapture:
    """fd 1 and 2 of this process go into pipes; each line becomes an ``OutputLines`` event
    of the call running now (``run_id``)."""

    def __init__(self, run_id: str, rank: int, emit: Any) -> None:
        self.run_id = run_id
        self.rank = rank
        self._emit = emit
        self._reading = threading.Lock()
        self._readers: list[tuple[int, threading.Thread]] = []
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(
                target=self._read, args=(read_end, stream), daemon=True, name=f"rank-{stream}"
            )
            thread.start()
            self._readers.append((read_end, thread))
        sys.stdout = _line_stream(1)
        sys.stderr = _line_stream(2)

    def _read(self, fd: int, stream: str) -> None:
        splitter = LineSplitter()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            poller.poll()
            # read and emitted under one lock: drained() holding it with nothing left unread
            # knows every byte written so far is an event
            with self._reading:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                lines = splitter.feed(data, time.monotonic())
                if lines:
                    run_id = self.run_id
                    self._emit(OutputLines(run_id, self.rank, stream, tuple(lines), time.time()))

    def drained(self) -> None:
        """Wait (briefly) until what was written so far is an event."""
        for stream in (sys.stdout, sys.stderr):
            become.best_effort(stream.flush)
        deadline = time.monotonic() + _DRAIN_S
        while time.monotonic() < deadline:
            with self._reading:
                if not any(_pending(fd) for fd, _ in self._readers):
                    return
            time.sleep(0.001)


def _pending(fd: int) -> int:
    buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("i", buf)[0])


def _line_stream(fd: int) -> io.TextIOWrapper:
    raw = open(fd, "wb", buffering=0, closefd=False)  # noqa: SIM115 - lives with the process
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


class RankActor:
    """The Ray actor of one rank: it serves one call after another of its standby set (same
    rank, same shape) until the caller kills it. Calls never overlap: Ray runs an actor's
    methods one at a time, on its main thread; the caller's commands (stop, stacks) arrive
    in the replies of the event thread's polls, so they are taken while the call runs."""

    def __init__(self, run_id: str, rank: int, sink: Any) -> None:
        self.started = time.time()
        self.run_id = run_id
        self.rank = rank
        self._sink = sink
        self._base_env = dict(os.environ)
        self._events: deque[Event] = deque()
        self._send_lock = threading.Lock()
        self._running = False
        self._main_ident = threading.get_ident()
        self._capture = OutputCapture(run_id, rank, self._events.append)
        threading.Thread(target=self._flush_loop, daemon=True, name="rank-events").start()

    def where(self, want_port: bool) -> dict[str, Any]:
        """Where this rank landed: node, address, the GPUs Ray gave it, and (for rank 0) two
        free ports on its node: for a process group's store, and for the next call's."""
        import ray

        ctx = ray.get_runtime_context()
        ip = ray.util.get_node_ip_address()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ip,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": self.started,
            "main_thread": f"{self._main_ident:016x}",
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "port": _free_port(ip) if want_port else None,
            "next_port": _free_port(ip) if want_port else None,
        }

    def form_group(self, plan: Any) -> bool:
        """Standby, after a call: shut down the call's process group, then (with a ``plan``)
        form the next call's default group with the set's other ranks (``warm_group.form``:
        NCCL on GPU nodes, gloo in CPU mode)."""
        become.best_effort(warm_group.finish)
        if plan is None:
            return False
        try:
            return warm_group.form(plan)
        except Exception as exc:  # no torch on this node: the call forms its own group
            print(f"serverless-gpu: no process group made ahead of the call: {exc}", flush=True)
            return False

    def run(self, payload: bytes, spec: RayRankSpec) -> Any:
        """Run the call; returns ``("ok", [result], summary)`` (an object ref, or a
        ``results.ResultFile`` on the caller's machine) or ``("error", record, summary)``."""
        self.run_id = self._capture.run_id = spec.run.run_id
        try:
            outcome = become.run_call(spec, _ActorTransport(self, payload, spec))
        finally:
            self._running = False
            self._capture.drained()
            self._flush(wait=True)
        # The call's process group is shut down by form_group, outside the call's time.
        return outcome

    # -- events to the caller, commands from it -----------------------------------------------

    def _to_caller(self, kind: str, data: Any) -> None:
        at_once = isinstance(data, CellEnd) and event_route.current() is not None
        if at_once:
            self._capture.drained()  # the cell's output goes first, and all of it now
        self._events.append(RankMessage(self.run_id, self.rank, kind, data, time.time()))
        if at_once:
            self._route()

    def _route(self) -> None:
        """Send the events through the session's connection, if it has one (no Ray call)."""
        route = event_route.current()
        if route is None:
            return
        with self._send_lock:
            batch = [self._events.popleft() for _ in range(len(self._events))]
            if batch:
                route(batch)

    def _flush_loop(self) -> None:
        idle = 0.0
        while True:
            time.sleep(_FLUSH_S)
            idle += _FLUSH_S
            become.best_effort(self._route)  # a session's rank: its events go at once
            # While a call runs, an empty batch is sent now and then too: its reply carries
            # the caller's commands.
            if self._events or (self._running and idle >= _POLL_S):
                idle = 0.0
                become.best_effort(self._flush, True)

    def _flush(self, wait: bool) -> None:
        import ray

        self._route()
        with self._send_lock:  # with a route, the sink only brings the caller's commands
            batch = [self._events.popleft() for _ in range(len(self._events))]
            ref = self._sink.put.remote(self.rank, batch)
            commands: list[str] = ray.get(ref, timeout=10) if wait else []
        for command in commands:
            self._command(command)

    def _command(self, command: str) -> None:
        if command == STOP:
            stop_request.request()
        elif command == STACKS:
            text = _all_stacks()
            self._events.append(RankMessage(self.run_id, self.rank, STACKS, text, time.time()))
        elif command == FLUSH:  # the run is stopped: what the rank holds goes before its end
            runtime.run_stopped_callbacks()
            self._events.append(RankMessage(self.run_id, self.rank, FLUSH, None, time.time()))


_POLL_S = 0.3


def _all_stacks() -> str:
    """Every thread's stacks in faulthandler's text (the same C walker the local ranks' signal
    handler runs: it reads the main thread's frames while that thread is blocked in C)."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return doctor.without_thread(f.read(), threading.get_ident())


class _ActorTransport(become.Transport[Any]):
    """A rank's call in a Ray actor: the payload from the object store, messages and output as
    events to the set's sink; the answer is the actor's reply (``RankActor.run``)."""

    remote = True

    def __init__(self, actor: RankActor, payload: bytes, spec: RayRankSpec) -> None:
        self.actor = actor
        self.payload = payload
        self.spec = spec

    def kept_env(self, env: dict[str, str]) -> dict[str, str]:
        """The actor's start-up variables Ray's worker needs, never a previous call's."""
        return {
            k: v
            for k, v in self.actor._base_env.items()
            if k.startswith("RAY_") or (k in NODE_LOCAL_ENV and k not in env)
        }

    def to_caller(self, kind: str, data: Any) -> None:
        self.actor._to_caller(kind, data)

    def started(self) -> None:
        self.actor._running = True

    def load(self) -> become.Payload:
        return load_payload(io.BytesIO(self.payload))

    def exited(self, exc: SystemExit) -> Any:
        code = become.exit_code(exc)
        return self.failed(exc, RAISED, "SystemExit", f"exited with code {code}")

    def failed(self, exc: BaseException, kind: FailureKind, type_name: str, message: str) -> Any:
        record = become.error_record(self.spec.rank, exc, kind, type_name, message)
        become.best_effort(sys.stderr.write, record.traceback_text)
        return ("error", record, record.failure.detail)

    def hand_over(self, result: Any) -> Any:
        spec = self.spec
        try:
            held = results.hand_over(result, spec.results, spec.rank, spec.run.world_size)
        except Exception as exc:  # cannot be serialized: say which rank and which type
            type_name = become.qualified_type(result)
            return self.failed(exc, UNPICKLABLE_RESULT, type_name, exception_message(exc))
        return ("ok", [held], describe_value(result))


def _free_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class EventSink:
    """Per standby set, on the caller's node: ranks put their events and get the caller's
    commands back; the caller takes the events and leaves commands."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._commands: dict[int, list[str]] = {}

    def put(self, rank: int, batch: list[Event]) -> list[str]:
        self._events.extend(batch)
        return self._commands.pop(rank, [])

    def take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def command(self, ranks: list[int], command: str) -> None:
        for rank in ranks:
            self._commands.setdefault(rank, []).append(command)

    def clear(self) -> None:
        """A new call of the set starts: nothing of the last one is left."""
        self._events.clear()
        self._commands.clear()
