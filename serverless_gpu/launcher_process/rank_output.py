"""In the launcher: one run's rank output, from the ranks' pipes to the caller.

Each rank's stdout and stderr are teed into its log file and split into lines for the caller
(``OutputLines``); a stream that floods is read less often (``OutputPacer``) and its idle
partial line is sent on its own after a while (a prompt, a progress bar).
"""

from __future__ import annotations

import selectors
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.runfiles.rundirs import RUNS_DIR_ENV
from serverless_gpu.wire.events import OutputLines
from serverless_gpu.wire.runspec import RunSpec


class RankOutput:
    """The output streams of a run's ranks; the selector's callbacks run through ``guard``
    (an error in one fails the run, never the launcher)."""

    def __init__(
        self,
        spec: RunSpec,
        procs: Sequence[RankProcess],
        emit: Callable[[Any], None],
        selector: selectors.BaseSelector,
        guard: Callable[..., None],
        fail: Callable[[str], None],
    ) -> None:
        self.run_id = spec.run_id
        self.paths = spec.paths
        self.procs = procs
        self.emit = emit
        self.selector = selector
        self.guard = guard
        self.fail = fail
        """Fails the run: a log that cannot be written (a full disk) stops it."""
        self.to_logs_only = False
        """After the run's end (its ranks' teardown) output goes to the logs only."""
        spec.paths.logs.mkdir(mode=0o700, exist_ok=True)
        self.logs: list[IO[bytes]] = []
        try:
            for r in range(len(procs)):
                self.logs.append(open(spec.paths.log(r), "ab", buffering=0))  # noqa: SIM115
        except BaseException:
            self.close()
            raise

    def attach(self, rank: int) -> None:
        for stream, fd in self.procs[rank].pipes.items():
            self._register(fd, rank, stream)

    def _register(self, fd: int, rank: int, stream: str) -> None:
        self.selector.register(
            fd, selectors.EVENT_READ, lambda _fd: self.guard(self.read, rank, stream)
        )

    def _lines(self, rank: int, stream: str, pieces: Sequence[str]) -> None:
        if pieces:
            self.emit(OutputLines(self.run_id, rank, stream, tuple(pieces), time.time()))

    def read(self, rank: int, stream: str) -> None:
        """Read what ``stream`` holds (the selector found it readable, or its pause is over)."""
        proc = self.procs[rank]
        data, eof = proc.read(stream)
        now = time.monotonic()
        if data:
            self._log(rank, data)
            if not self.to_logs_only:
                self._lines(rank, stream, proc.splitters[stream].feed(data, now))
        if eof:
            self._closed(rank, stream)
        else:
            self._pace(rank, stream, bool(data), now)

    def _closed(self, rank: int, stream: str) -> None:
        proc = self.procs[rank]
        if not proc.pacer.is_paused(stream):
            self.selector.unregister(proc.pipes[stream])
        proc.pacer.forget(stream)
        proc.close_pipe(stream)
        if not self.to_logs_only:
            self._lines(rank, stream, proc.splitters[stream].close())

    def _pace(self, rank: int, stream: str, got_data: bool, now: float) -> None:
        """Stop watching a stream that floods until it is due again, then watch it again."""
        proc = self.procs[rank]
        was_paused = proc.pacer.is_paused(stream)
        paused = proc.pacer.after_read(stream, got_data, now)
        if paused and not was_paused:
            self.selector.unregister(proc.pipes[stream])
        elif was_paused and not paused:
            self._register(proc.pipes[stream], rank, stream)

    def read_all(self, rank: int) -> None:
        """Read what every open stream of ``rank`` holds (it exited, or it returned)."""
        for stream in list(self.procs[rank].pipes):
            self.read(rank, stream)

    def flush(self, rank: int) -> None:
        """Everything ``rank`` wrote so far, its partial lines too: it has returned and the run
        is reported now, its output first."""
        self.read_all(rank)
        proc = self.procs[rank]
        for stream, splitter in proc.splitters.items():
            self._lines(rank, stream, splitter.close() if stream in proc.pipes else ())

    def read_due(self, now: float) -> None:
        """Paused streams whose time has come, and partial lines idle for long enough."""
        for rank, proc in enumerate(self.procs):
            for stream in proc.pacer.due(now):
                self.read(rank, stream)
            for stream, splitter in proc.splitters.items():
                open_stream = stream in proc.pipes and not self.to_logs_only
                piece = splitter.flush_idle(now) if open_stream else None
                if piece:
                    self._lines(rank, stream, (piece,))

    def next_wake(self) -> float | None:
        """When a paused output stream is due to be read (see OutputPacer)."""
        due = (t for p in self.procs if (t := p.pacer.next_due()) is not None)
        return min(due, default=None)

    def _log(self, rank: int, data: bytes) -> None:
        """Tee output into the rank's log; a full disk stops the logs, never the stream."""
        log = self.logs[rank]
        if log.closed:
            return
        try:
            log.write(data)
        except OSError as exc:
            self.close()
            self.fail(_log_failure(self.paths.run_dir, rank, exc))

    def close(self) -> None:
        for f in self.logs:
            try:
                f.close()
            except OSError:
                pass  # data the full disk refused; the run reports it


def _log_failure(run_dir: Path, rank: int, exc: OSError) -> str:
    """What the user reads when a rank's log cannot be written (a full disk, most often)."""
    folder = run_dir.parent
    text = f"could not write rank {rank}'s log in {folder}: {exc.strerror or exc}"
    try:
        usage = shutil.disk_usage(folder)
        text += f" ({usage.free >> 20} MiB free of {usage.total >> 20} MiB)"
    except OSError:
        pass
    return (
        f"{text}; the call was stopped. Free space there or set {RUNS_DIR_ENV} to a folder with "
        "more room."
    )
