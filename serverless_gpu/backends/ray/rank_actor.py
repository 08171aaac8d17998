"""One rank on a Ray node: an actor that captures its process's output, runs the user's function
once and hands back the result (through Ray's object store) or the failure's error record.

The function runs on the actor's main thread, as a local rank runs it; output is read by two
threads and sent, with the rank's messages, to the run's event sink every 0.1 s.
"""

from __future__ import annotations

import fcntl
import io
import os
import socket
import struct
import sys
import termios
import threading
import time
from collections import deque
from typing import Any

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
from serverless_gpu.rank import runtime, seeding
from serverless_gpu.runfiles.serialization import load_payload
from serverless_gpu.wire.events import Event, OutputLines, RankMessage

worker.hide_frames_of(__file__)
_FLUSH_S = 0.1
_DRAIN_S = 2.0
NODE_LOCAL_ENV = ("CUDA_VISIBLE_DEVICES",)
"""Variables a rank keeps from its node (Ray sets them per actor) unless the call sets them;
Ray's own ``RAY_*`` variables are always the node's."""


class OutputCapture:
    """fd 1 and 2 of this process go into pipes; each line becomes an ``OutputLines`` event."""

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
                self._emit(OutputLines(self.run_id, self.rank, stream, tuple(lines), time.time()))

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
    """The Ray actor of one rank of one call; it serves that call only and is killed after."""

    def __init__(self, run_id: str, rank: int, sink: Any) -> None:
        self.run_id = run_id
        self.rank = rank
        self._sink = sink
        self._events: deque[Event] = deque()
        self._send_lock = threading.Lock()
        self._capture = OutputCapture(run_id, rank, self._events.append)
        threading.Thread(target=self._flush_loop, daemon=True, name="rank-events").start()

    def where(self, want_port: bool) -> dict[str, Any]:
        """Where this rank landed: node, address, the GPUs Ray gave it, and (for rank 0) a
        free port on its node for the process group's store."""
        import ray

        ctx = ray.get_runtime_context()
        ip = ray.util.get_node_ip_address()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ip,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "port": _free_port(ip) if want_port else None,
        }

    def run(
        self, payload: bytes, env: dict[str, str], cwd: str, sys_path: list[str], name: str
    ) -> Any:
        """Run the call; returns ``("ok", [result_ref], summary)`` or
        ``("error", record, summary)``."""
        import ray

        _become_rank(env, cwd, sys_path, name)
        runtime.connect(self._to_caller)
        try:
            outcome = self._call(payload, ray)
        finally:
            self._capture.drained()
            self._flush(wait=True)
        return outcome

    def _call(self, payload: bytes, ray: Any) -> Any:
        try:
            result = worker.call_function(lambda: load_payload(io.BytesIO(payload)))
        except SystemExit as exc:
            code = worker.exit_code(exc)
            return self._error(exc, RAISED, "SystemExit", f"exited with code {code}")
        except BaseException as exc:  # the user's failure goes back to the caller
            return self._error(exc, RAISED, worker.qualified_type(exc), exception_message(exc))
        try:
            ref = ray.put(result)
        except Exception as exc:  # cannot be serialized: say which rank and which type
            return self._error(
                exc, UNPICKLABLE_RESULT, worker.qualified_type(result), exception_message(exc)
            )
        return ("ok", [ref], describe_value(result))

    def _error(self, exc: BaseException, kind: FailureKind, type_name: str, message: str) -> Any:
        record = worker.error_record(self.rank, exc, kind, type_name, message)
        worker.best_effort(sys.stderr.write, record.traceback_text)
        return ("error", record, record.failure.detail)

    # -- events to the caller -----------------------------------------------------------------

    def _to_caller(self, kind: str, data: Any) -> None:
        self._events.append(RankMessage(self.run_id, self.rank, kind, data, time.time()))

    def _flush_loop(self) -> None:
        while True:
            time.sleep(_FLUSH_S)
            worker.best_effort(self._flush, False)

    def _flush(self, wait: bool) -> None:
        import ray

        with self._send_lock:
            batch = [self._events.popleft() for _ in range(len(self._events))]
            if batch:
                ref = self._sink.put.remote(batch)
                if wait:
                    ray.get(ref, timeout=10)


def _become_rank(env: dict[str, str], cwd: str, sys_path: list[str], name: str) -> None:
    set_rank_title(int(env["RANK"]), int(env["WORLD_SIZE"]), name)
    keep = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("RAY_") or (k in NODE_LOCAL_ENV and k not in env)
    }
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
    """Per call, on the caller's node: ranks put their events, the caller takes them."""

    def __init__(self) -> None:
        self._events: list[Event] = []

    def put(self, batch: list[Event]) -> None:
        self._events.extend(batch)

    def take(self) -> list[Event]:
        events, self._events = self._events, []
        return events
