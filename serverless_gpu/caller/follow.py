"""``result(logs=True)``: every rank's log printed as it is written, until the run ends.

Read from the run's log files (``RunPaths.log``), not from its events, so that a handle of
this process and a run re-attached from another one print the same lines, each once.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from serverless_gpu.caller.console import ConsolePrinter
from serverless_gpu.caller.waits import deadline_of
from serverless_gpu.wire.events import Subscriber
from serverless_gpu.wire.runpaths import RunPaths

STEP_S = 0.2
"""How often the logs are read while the run goes on."""


class LogTail:
    """Where each rank's log was read up to; prints complete lines, each with ``[rank N]``
    first unless ``prefix`` is false."""

    def __init__(self, stream: TextIO | None = None, *, prefix: bool = True) -> None:
        self.stream = stream
        self.prefix = prefix
        self._read: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def emit(self, logs: dict[int, Path]) -> None:
        """Print the lines the ranks' logs (by rank) gained since the last call."""
        for rank, path in logs.items():
            try:
                with path.open("rb") as f:
                    f.seek(self._read.get(path, 0))
                    raw = f.read()
            except OSError:  # pruned meanwhile, or not written yet: what was printed stays
                continue
            self._read[path] = self._read.get(path, 0) + len(raw)
            done, newline, rest = (self._partial.pop(path, b"") + raw).rpartition(b"\n")
            if rest:
                self._partial[path] = rest
            if newline:
                self._write(rank, done + newline)

    def flush(self, logs: dict[int, Path]) -> None:
        """The run has ended: the last line of each log, also without its newline."""
        self.emit(logs)
        for rank, path in logs.items():
            rest = self._partial.pop(path, b"")
            if rest:
                self._write(rank, rest + b"\n")

    def _write(self, rank: int, data: bytes) -> None:
        text = data.decode(errors="replace")
        if self.prefix:
            text = "".join(f"[rank {rank}] {line}" for line in text.splitlines(keepends=True))
        out = self.stream if self.stream is not None else sys.stdout
        out.write(text)
        out.flush()


def follow(
    paths: Callable[[], RunPaths], wait: Callable[[float], bool], deadline: float | None
) -> bool:
    """Print the logs of ``paths()`` (read afresh: a retried call moves to a new run) while
    ``wait(seconds)`` says the run goes on, until ``deadline`` (``time.monotonic()``); True
    once the run has ended."""
    tail = LogTail()
    while True:
        left = STEP_S if deadline is None else min(STEP_S, deadline - time.monotonic())
        ended = wait(max(0.0, left))
        current = paths().existing_logs()
        if ended:
            tail.flush(current)
            return True
        tail.emit(current)
        if deadline is not None and time.monotonic() >= deadline:
            return False


def followed(
    paths: Callable[[], RunPaths],
    printers: list[Subscriber],
    wait: Callable[[float], bool],
    timeout: float | None,
) -> float | None:
    """``result(logs=True)``: follow the ranks' logs while ``wait(seconds)`` says the run goes
    on, until it ends or ``timeout``, the console printers among ``printers`` held back; the
    time left of ``timeout``."""
    deadline = deadline_of(timeout)
    with muted(printers):
        follow(paths, wait, deadline)
    return None if deadline is None else max(0.0, deadline - time.monotonic())


@contextlib.contextmanager
def muted(subscribers: list[Subscriber]) -> Iterator[None]:
    """The console printers among ``subscribers`` print no rank output while the logs are
    followed (they would print the same lines)."""
    printers = [s for s in subscribers if isinstance(s, ConsolePrinter)]
    outputs = [p.output for p in printers]
    for printer in printers:
        printer.output = "none"
    try:
        yield
    finally:
        for printer, output in zip(printers, outputs, strict=True):
            printer.output = output
