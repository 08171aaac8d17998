"""Supervising one call's ranks inside the launcher: the per-run state machine.

Root cause = the first failure in time. Any failure, a timeout or a cancel stops every other
rank at once (TERM, then KILL after the grace period), also ranks blocked in a collective.
"""

from __future__ import annotations

import functools
import selectors
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .channel import Undecodable
from .events import (
    OutputLines,
    RankFinished,
    RankMessage,
    RankStarted,
    RankState,
    RunFinished,
    RunStatus,
)
from .launcher_log import log, log_exception
from .lifetime import kill_group, signal_name
from .protocol import RankDone, RankSpec, Release, ToCaller, UserCodeStarted
from .rank_process import RankProcess
from .rundirs import RUNS_DIR_ENV
from .runspec import RunSpec

_RELEASE_GRACE_S = 5.0
_DRAIN_ROUNDS = 64
"""Reads of an exited rank's channel (16 MiB each) before its last messages are given up."""


class RunSupervisor:
    """Owns the ranks of one call from spec to the last exit."""

    def __init__(
        self,
        spec: RunSpec,
        ranks: list[RankProcess],
        master_port: int,
        emit: Callable[[Any], None],
        selector: selectors.BaseSelector,
    ) -> None:
        self.spec = spec
        self.ranks = ranks
        self.master_port = master_port
        self.emit = emit
        self.selector = selector
        self.status = RunStatus.RUNNING
        self.message = ""
        self.failures: list[tuple[float, int, str]] = []
        self.returned: set[int] = set()
        self.raised: set[int] = set()
        self.exited: set[int] = set()
        self.hung_up: set[int] = set()
        self.summaries: dict[int, str] = {}
        self.unfinished: tuple[int, ...] = ()
        self.stopping = False
        self.kill_deadline: float | None = None
        self.grace = spec.grace
        self.deadline = time.monotonic() + spec.timeout if spec.timeout is not None else None
        self.finished = False
        self.run_failure: tuple[float, str] | None = None
        """A failure of the run itself (not of a rank): its time and message."""
        spec.paths.logs.mkdir(mode=0o700, exist_ok=True)
        self.logs: list[IO[bytes]] = []
        try:
            for r in range(len(ranks)):
                self.logs.append(open(spec.paths.log(r), "ab", buffering=0))  # noqa: SIM115
        except BaseException:
            self._close_logs()
            raise

    def start(self) -> None:
        for rank, proc in enumerate(self.ranks):
            proc.channel.attach(
                self.selector, functools.partial(self._guarded, self._on_message, rank)
            )
            self.selector.register(proc.pidfd, selectors.EVENT_READ, self._cb(self._on_exit, rank))
            for stream, fd in proc.pipes.items():
                self.selector.register(
                    fd, selectors.EVENT_READ, self._cb(self._on_output, rank, stream)
                )
            # Buffered: a rank that does not read must not stall the launcher. One that died
            # already is reported through its pidfd.
            proc.channel.send(RankSpec(self.spec, rank, self.master_port))

    def _cb(self, method: Callable[..., None], *args: Any) -> Callable[[Any], None]:
        return lambda _fd: self._guarded(method, *args)

    def _guarded(self, method: Callable[..., object], *args: Any) -> None:
        """Any error while supervising fails this run with its cause, never the launcher."""
        try:
            method(*args)
        except Exception as exc:
            log_exception(f"run {self.spec.run_id}")
            self.fail(f"the launcher failed while supervising the run: {type(exc).__name__}: {exc}")

    def fail(self, message: str) -> None:
        """Fail the run itself (not one rank): stop every rank, report ``message``."""
        if self.run_failure is None and not (self.stopping or self.finished):
            self.run_failure = (time.time(), message)
        self._stop(RunStatus.FAILED, message)

    # -- events from the ranks -------------------------------------------------------------------

    def _on_message(self, rank: int) -> bool:
        """Handle what the rank's channel holds; True while there may be more to read (a
        large message may take several reads)."""
        proc = self.ranks[rank]
        messages, eof = proc.channel.receive()
        for message in messages:
            self._dispatch(rank, message)
        if eof and rank not in self.hung_up:
            self.hung_up.add(rank)
            proc.channel.detach()
        return proc.channel.last_read > 0 and not eof

    def _dispatch(self, rank: int, message: Any) -> None:
        proc = self.ranks[rank]
        if isinstance(message, Undecodable):
            log(f"rank {rank} sent a message the launcher cannot load: {message.error!r}")
        elif isinstance(message, UserCodeStarted):
            self.emit(RankStarted(self.spec.run_id, rank, proc.pid, message.time))
        elif isinstance(message, RankDone) and message.ok:
            self.summaries[rank] = message.summary
            self.returned.add(rank)
            if len(self.returned) == len(self.ranks) and not self.stopping:
                self._release_all()
        elif isinstance(message, ToCaller):
            self.emit(RankMessage(self.spec.run_id, rank, message.kind, message.data, message.time))
        elif isinstance(message, RankDone):
            self.summaries[rank] = message.summary
            self.raised.add(rank)
            self.failures.append((message.time, rank, f"raised {message.summary}"))
            self._stop(RunStatus.FAILED)

    def _release_all(self) -> None:
        for proc in self.ranks:
            proc.channel.send(Release())
        self.kill_deadline = time.monotonic() + _RELEASE_GRACE_S

    def _on_output(self, rank: int, stream: str) -> None:
        proc = self.ranks[rank]
        data, eof = proc.read(stream)
        now = time.monotonic()
        if data:
            self._log(rank, data)
            pieces = proc.splitters[stream].feed(data, now)
            if pieces:
                self.emit(OutputLines(self.spec.run_id, rank, stream, tuple(pieces), time.time()))
        was_paused = proc.pacer.is_paused(stream)
        if eof:
            if not was_paused:
                self.selector.unregister(proc.pipes[stream])
            proc.pacer.forget(stream)
            proc.close_pipe(stream)
            rest = proc.splitters[stream].close()
            if rest:
                self.emit(OutputLines(self.spec.run_id, rank, stream, tuple(rest), time.time()))
            return
        paused = proc.pacer.after_read(stream, bool(data), now)
        if paused and not was_paused:
            self.selector.unregister(proc.pipes[stream])
        elif was_paused and not paused:
            self.selector.register(
                proc.pipes[stream], selectors.EVENT_READ, self._cb(self._on_output, rank, stream)
            )

    def _log(self, rank: int, data: bytes) -> None:
        """Tee output into the rank's log; a full disk stops the logs, never the stream."""
        log = self.logs[rank]
        if log.closed:
            return
        try:
            log.write(data)
        except OSError as exc:
            self._close_logs()
            self.fail(_log_failure(self.spec.paths.run_dir, rank, exc))

    def _close_logs(self) -> None:
        for f in self.logs:
            try:
                f.close()
            except OSError:
                pass  # data the full disk refused; the run reports it

    def next_wake(self) -> float | None:
        """When a paused output stream is due to be read (see OutputPacer)."""
        return min((t for p in self.ranks if (t := p.pacer.next_due()) is not None), default=None)

    def _on_exit(self, rank: int) -> None:
        proc = self.ranks[rank]
        status = proc.poll()
        if status is None or rank in self.exited:
            return
        self.exited.add(rank)
        self.selector.unregister(proc.pidfd)
        for _ in range(_DRAIN_ROUNDS):  # a RankDone sent just before exiting
            if rank in self.hung_up or not self._on_message(rank):
                break
        for stream in list(proc.pipes):
            self._on_output(rank, stream)
        state = self._classify_exit(rank, status)
        self.emit(
            RankFinished(
                self.spec.run_id,
                rank,
                state,
                status,
                signal_name(status),
                time.time(),
                self.summaries.get(rank, ""),
            )
        )
        if len(self.exited) == len(self.ranks):
            self._finish()

    def _classify_exit(self, rank: int, status: int) -> RankState:
        if rank in self.returned:
            return RankState.DONE
        if rank in self.raised:
            return RankState.FAILED
        if self.stopping:
            return RankState.KILLED
        sig = signal_name(status)
        if sig is not None:
            what = f"was killed by {sig}"
        elif status != 0:
            what = f"exited with code {status}"
        else:
            what = "exited with code 0 without returning a result"
        self.failures.append((time.time(), rank, what))
        self._stop(RunStatus.FAILED)
        return RankState.FAILED

    # -- stopping ----------------------------------------------------------------------------------

    def cancel(self, reason: str) -> None:
        self._stop(RunStatus.CANCELLED, reason)

    def _stop(self, status: RunStatus, message: str = "") -> None:
        if self.stopping or self.finished:
            return
        self.stopping = True
        self.status = status
        self.message = message
        self.unfinished = tuple(
            r for r in range(len(self.ranks)) if r not in self.returned | self.raised
        )
        for rank, proc in enumerate(self.ranks):
            if rank not in self.exited | self.raised:  # a rank that raised is exiting already
                kill_group(proc.pid, signal.SIGTERM)
        self.kill_deadline = time.monotonic() + self.grace

    def tick(self, now: float, read_output: bool = True) -> None:
        """Timers: paused output streams, idle partial lines, the timeout, the SIGKILL after
        the grace period. ``read_output=False`` while the caller is not reading."""
        if read_output:
            self._read_due_output(now)
        if self.deadline is not None and now >= self.deadline and not self.stopping:
            running = [r for r in range(len(self.ranks)) if r not in self.returned | self.raised]
            limit = self.spec.timeout or 0.0
            self._stop(
                RunStatus.TIMED_OUT,
                f"exceeded its timeout of {limit:g} s; ranks still running: "
                + ", ".join(map(str, running)),
            )
        if self.kill_deadline is not None and now >= self.kill_deadline:
            for rank, proc in enumerate(self.ranks):
                if rank not in self.exited:
                    kill_group(proc.pid, signal.SIGKILL)

    def _read_due_output(self, now: float) -> None:
        for rank, proc in enumerate(self.ranks):
            for stream in proc.pacer.due(now):
                self._on_output(rank, stream)
            for stream, splitter in proc.splitters.items():
                piece = splitter.flush_idle(now) if stream in proc.pipes else None
                if piece:
                    self.emit(OutputLines(self.spec.run_id, rank, stream, (piece,), time.time()))

    def _finish(self) -> None:
        root: int | None = None
        cause = ""
        first = min(self.failures) if self.failures else None
        if self.run_failure is not None and (first is None or self.run_failure[0] <= first[0]):
            self.status = RunStatus.FAILED
            self.message = self.run_failure[1]
        elif first is not None and self.status is RunStatus.FAILED:
            _when, root, cause = first
            self.message = f"rank {root} {cause}"
        elif not self.stopping:
            self.status = RunStatus.SUCCEEDED
        self.finished = True
        self.emit(
            RunFinished(
                self.spec.run_id,
                self.status,
                root,
                self.message,
                self.unfinished,
                time.time(),
                cause=cause,
            )
        )

    def finish_now(self) -> None:
        """For launcher shutdown: every rank has been reaped outside the select loop."""
        for rank, proc in enumerate(self.ranks):
            if rank not in self.exited and proc.exit_status is not None:
                self.exited.add(rank)
        if not self.finished:
            self._finish()

    def close(self) -> None:
        for proc in self.ranks:
            for fd in proc.open_fds():
                try:
                    self.selector.unregister(fd)
                except (KeyError, ValueError, OSError):
                    pass
            proc.close()
        self._close_logs()


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
