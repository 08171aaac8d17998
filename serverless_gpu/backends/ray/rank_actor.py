"""One rank on a Ray node: an actor that captures its process's output, runs the user's function
and hands back the result (a file in the caller's results twin on the caller's machine,
else through Ray's object store: ``results.py``) or the failure's error record; after a
call that succeeded it stays for the next call of its set (``standby.py``).

The function runs on the actor's main thread, as a local rank runs it; output is read by two
threads and sent, with the rank's messages, to the set's event sink every 0.1 s.
"""

from __future__ import annotations

import faulthandler
import fcntl
import io
import os
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
from serverless_gpu.backends.ray.doctor import STACKS, STOP
from serverless_gpu.common.describe import describe_value
from serverless_gpu.common.errors import (
    RAISED,
    UNPICKLABLE_RESULT,
    FailureKind,
    exception_message,
)
from serverless_gpu.common.output import LineSplitter
from serverless_gpu.common.proctitle import set_rank_title
from serverless_gpu.rank import main as worker
from serverless_gpu.rank import runtime, seeding, stop_request, warm_group
from serverless_gpu.runfiles.serialization import load_payload
from serverless_gpu.wire.events import Event, OutputLines, RankMessage

worker.hide_frames_of(__file__)
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
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            lines = splitter.feed(data, time.monotonic())
            if lines:
                run_id = self.run_id
                self._emit(OutputLines(run_id, self.rank, stream, tuple(lines), time.time()))

    def drained(self) -> None:
        """Wait (briefly) until what was written so far has been read."""
        for stream in (sys.stdout, sys.stderr):
            worker.best_effort(stream.flush)
        deadline = time.monotonic() + _DRAIN_S
        while time.monotonic() < deadline and any(_pending(fd) for fd, _ in self._readers):
            time.sleep(0.01)
        time.sleep(0.02)  # the reader's last piece becomes its event


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
        worker.best_effort(warm_group.finish)
        if plan is None:
            return False
        try:
            return warm_group.form(plan)
        except Exception as exc:  # no torch on this node: the call forms its own group
            print(f"serverless-gpu: no process group made ahead of the call: {exc}", flush=True)
            return False

    def run(
        self,
        payload: bytes,
        env: dict[str, str],
        cwd: str,
        sys_path: list[str],
        name: str,
        call: dict[str, Any],
    ) -> Any:
        """Run the call; returns ``("ok", [result], summary)`` (an object ref, or a
        ``results.ResultFile`` on the caller's machine) or ``("error", record, summary)``.
        ``call``: ``run_id``, ``adopt`` (the group formed ahead is the call's), ``warm``
        (``warm_process_group``) and ``results`` (``results.ResultsPlace`` or None)."""
        self.run_id = self._capture.run_id = call["run_id"]
        _become_rank(self._base_env, env, cwd, sys_path, name)
        stop_request.reset()
        warm_group.settle(call["adopt"], call["warm"])
        runtime.connect(self._to_caller)
        self._running = True
        try:
            outcome = self._call(payload, call.get("results"))
        finally:
            self._running = False
            self._capture.drained()
            self._flush(wait=True)
        # The call's process group is shut down by form_group, outside the call's time.
        return outcome

    def _call(self, payload: bytes, place: results.ResultsPlace | None) -> Any:
        try:
            result = worker.call_function(lambda: load_payload(io.BytesIO(payload)))
        except SystemExit as exc:
            code = worker.exit_code(exc)
            return self._error(exc, RAISED, "SystemExit", f"exited with code {code}")
        except BaseException as exc:  # the user's failure goes back to the caller
            return self._error(exc, RAISED, worker.qualified_type(exc), exception_message(exc))
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            held = results.hand_over(result, place, self.rank, world)
        except Exception as exc:  # cannot be serialized: say which rank and which type
            return self._error(
                exc, UNPICKLABLE_RESULT, worker.qualified_type(result), exception_message(exc)
            )
        return ("ok", [held], describe_value(result))

    def _error(self, exc: BaseException, kind: FailureKind, type_name: str, message: str) -> Any:
        record = worker.error_record(self.rank, exc, kind, type_name, message)
        worker.best_effort(sys.stderr.write, record.traceback_text)
        return ("error", record, record.failure.detail)

    # -- events to the caller, commands from it -----------------------------------------------

    def _to_caller(self, kind: str, data: Any) -> None:
        self._events.append(RankMessage(self.run_id, self.rank, kind, data, time.time()))

    def _flush_loop(self) -> None:
        idle = 0.0
        while True:
            time.sleep(_FLUSH_S)
            idle += _FLUSH_S
            # While a call runs, an empty batch is sent now and then too: its reply carries
            # the caller's commands.
            if self._events or (self._running and idle >= _POLL_S):
                idle = 0.0
                worker.best_effort(self._flush, True)

    def _flush(self, wait: bool) -> None:
        import ray

        with self._send_lock:
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


_POLL_S = 0.3


def _all_stacks() -> str:
    """Every thread's stacks in faulthandler's text (the same C walker the local ranks' signal
    handler runs: it reads the main thread's frames while that thread is blocked in C)."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return doctor.without_thread(f.read(), threading.get_ident())


def _become_rank(
    base: dict[str, str], env: dict[str, str], cwd: str, sys_path: list[str], name: str
) -> None:
    """The call's environment on top of the actor's own start-up one (never a previous
    call's: a variable that call set and this caller has not is gone)."""
    set_rank_title(int(env["RANK"]), int(env["WORLD_SIZE"]), name)
    keep = {
        k: v
        for k, v in base.items()
        if k.startswith("RAY_") or (k in NODE_LOCAL_ENV and k not in env)
    }
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(keep)
    if os.path.isdir(cwd):  # another node may not have the caller's folder
        os.chdir(cwd)
    sys.path[:] = [p for p in sys_path if not p or os.path.exists(p)] + [
        p for p in sys.path if p not in sys_path
    ]
    worker.apply_thread_limit()
    seeding.reseed()


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
