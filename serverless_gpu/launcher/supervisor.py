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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from serverless_gpu.common.errors import root_cause
from serverless_gpu.common.lifetime import kill_group, signal_name
from serverless_gpu.launcher.log import log, log_exception
from serverless_gpu.launcher.rank_handle import RankProcess
from serverless_gpu.launcher.stop_signals import StackCapture, request_stacks, request_stop
from serverless_gpu.runfiles.rundirs import RUNS_DIR_ENV
from serverless_gpu.wire.channel import Undecodable
from serverless_gpu.wire.events import (
    OutputLines,
    RankFinished,
    RankMessage,
    RankStarted,
    RankState,
    RunFinished,
    RunStatus,
)
from serverless_gpu.wire.protocol import (
    GroupReady,
    RankDone,
    RankSpec,
    Release,
    ToCaller,
    UserCodeStarted,
)
from serverless_gpu.wire.runspec import RunSpec

_RELEASE_GRACE_S = 5.0
_DRAIN_ROUNDS = 64
"""Reads of an exited rank's channel (16 MiB each) before its last messages are given up."""


@dataclass
class _Rank:
    """One rank of the run, as the supervisor follows it."""

    proc: RankProcess
    state: RankState = RankState.STARTING
    summary: str = ""
    """What it returned (type, shape) or raised, in one line (``RankDone.summary``)."""
    exited: bool = False
    """Its exit has been seen and reported (``RankFinished``)."""
    hung_up: bool = False
    """Its channel reached end of file."""
    group_ready: bool | None = None
    """A standby rank forming a process group: whether it holds one (None: not said yet)."""

    @property
    def running(self) -> bool:
        """Not yet returned or failed: what a stop interrupts."""
        return self.state in (RankState.STARTING, RankState.RUNNING)


class RunSupervisor:
    """Owns the ranks of one call from spec to the last exit."""

    def __init__(
        self,
        spec: RunSpec,
        ranks: list[RankProcess],
        master_port: int,
        emit: Callable[[Any], None],
        selector: selectors.BaseSelector,
        grouped: bool = False,
    ) -> None:
        self.spec = spec
        self.grouped = grouped
        """The ranks form a process group before the call: specs wait for their GroupReady."""
        self.held = False
        """Specs wait for the launcher (ranks of a finished run still exit on our devices)."""
        self.specs_sent = False
        self.devices_freed = False
        """The launcher has handed this run's devices on (once its results were out)."""
        self.ranks = [_Rank(proc) for proc in ranks]
        self.master_port = master_port
        self.emit = emit
        self.selector = selector
        self.status = RunStatus.RUNNING
        """RUNNING until the run is stopped (the stop's reason) or ends (SUCCEEDED or FAILED)."""
        self.message = ""
        self.failures: list[tuple[float, int, str]] = []
        """Each rank's failure: when, which rank, what (``"raised ValueError: x"``)."""
        self.unfinished: tuple[int, ...] = ()
        """Ranks that were still running when the run was stopped."""
        self.kill_deadline: float | None = None
        self.grace = spec.grace
        self.deadline = time.monotonic() + spec.timeout if spec.timeout is not None else None
        self.finished = False
        """``RunFinished`` has been sent. On success that is as soon as every rank has
        reported its result; the ranks then exit (communicator and CUDA teardown) on their own
        time, still supervised until ``all_exited``."""
        self.asked: tuple[RunStatus, str] | None = None
        """The stop the ranks were asked for (graceful stop), while they have stop_grace."""
        self.ask_deadline: float | None = None
        self.capture: StackCapture | None = None
        self.stop_grace = float(spec.config.stop_grace)
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
        for rank, proc in enumerate(self.procs()):
            proc.channel.attach(
                self.selector, functools.partial(self._guarded, self._on_message, rank)
            )
            self.selector.register(proc.pidfd, selectors.EVENT_READ, self._cb(self._on_exit, rank))
            for stream, fd in proc.pipes.items():
                self.selector.register(
                    fd, selectors.EVENT_READ, self._cb(self._on_output, rank, stream)
                )
        self._send_specs()

    def unhold(self) -> None:
        self.held = False
        self._send_specs()

    def _send_specs(self) -> None:
        """Start the call in every rank, once they may: grouped ranks have said whether they
        hold their group (the call takes it only if all do)."""
        waiting = self.grouped and any(r.group_ready is None for r in self.ranks)
        if self.specs_sent or self.held or waiting or self.stopping:
            return
        self.specs_sent = True
        warm = self.grouped and all(r.group_ready for r in self.ranks)
        for rank, proc in enumerate(self.procs()):
            # Buffered: a rank that does not read must not stall the launcher. One that died
            # already is reported through its pidfd.
            proc.channel.send(RankSpec(self.spec, rank, self.master_port, warm))

    @property
    def all_exited(self) -> bool:
        return all(r.exited for r in self.ranks)

    def procs(self) -> list[RankProcess]:
        return [r.proc for r in self.ranks]

    def unreaped_pids(self) -> list[int]:
        """This run's ranks not reaped yet: a reaped rank's pid may belong to someone else."""
        return [r.proc.pid for r in self.ranks if r.proc.exit_status is None]

    def reap(self) -> None:
        """Reap every rank that has exited (its pid stays reserved until then)."""
        for r in self.ranks:
            r.proc.poll()

    def reap_by(self, deadline: float) -> None:
        """For shutdown, after SIGKILL: wait until ``deadline`` for each rank to be gone."""
        for r in self.ranks:
            r.proc.reap_by(deadline)

    @property
    def stopping(self) -> bool:
        """The run was stopped (a failure, the timeout, a cancel): every rank is being ended."""
        return self.status is not RunStatus.RUNNING

    def _running(self) -> list[int]:
        return [i for i, r in enumerate(self.ranks) if r.running]

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
        r = self.ranks[rank]
        proc = r.proc
        messages, eof = proc.channel.receive()
        for message in messages:
            self._dispatch(rank, message)
        if eof and not r.hung_up:
            r.hung_up = True
            proc.channel.detach()
        return proc.channel.last_read > 0 and not eof

    def _dispatch(self, rank: int, message: Any) -> None:
        r = self.ranks[rank]
        if isinstance(message, Undecodable):
            log(f"rank {rank} sent a message the launcher cannot load: {message.error!r}")
        elif isinstance(message, GroupReady):
            r.group_ready = message.ok
            self._send_specs()
        elif isinstance(message, UserCodeStarted):
            r.state = RankState.RUNNING
            self.emit(RankStarted(self.spec.run_id, rank, r.proc.pid, message.time))
        elif isinstance(message, RankDone) and message.ok:
            r.state, r.summary = RankState.DONE, message.summary
            if all(x.state is RankState.DONE for x in self.ranks) and not self.stopping:
                self._release_all()
                self._report_success()
        elif isinstance(message, ToCaller):
            self.emit(RankMessage(self.spec.run_id, rank, message.kind, message.data, message.time))
        elif isinstance(message, RankDone):
            r.state, r.summary = RankState.FAILED, message.summary
            self.failures.append((message.time, rank, message.failure))
            self._stop(RunStatus.FAILED)

    def _release_all(self) -> None:
        for r in self.ranks:
            r.proc.channel.send(Release())
        self.kill_deadline = time.monotonic() + _RELEASE_GRACE_S

    def _report_success(self) -> None:
        """Every rank has written its result: the caller gets them now, not after the ranks'
        teardown. Output the ranks wrote before their result goes first."""
        for rank, r in enumerate(self.ranks):
            for stream in list(r.proc.pipes):
                self._on_output(rank, stream)
            for stream, splitter in r.proc.splitters.items():
                rest = splitter.close() if stream in r.proc.pipes else ()
                if rest:
                    self.emit(OutputLines(self.spec.run_id, rank, stream, tuple(rest), time.time()))
            self.emit(
                RankFinished(self.spec.run_id, rank, r.state, None, None, time.time(), r.summary)
            )
        self._finish()

    def _on_output(self, rank: int, stream: str) -> None:
        proc = self.ranks[rank].proc
        data, eof = proc.read(stream)
        now = time.monotonic()
        if data:
            self._log(rank, data)
            # After the run's end (its ranks' teardown) output goes to the logs only.
            pieces = () if self.finished else proc.splitters[stream].feed(data, now)
            if pieces:
                self.emit(OutputLines(self.spec.run_id, rank, stream, tuple(pieces), time.time()))
        was_paused = proc.pacer.is_paused(stream)
        if eof:
            if not was_paused:
                self.selector.unregister(proc.pipes[stream])
            proc.pacer.forget(stream)
            proc.close_pipe(stream)
            rest = () if self.finished else proc.splitters[stream].close()
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
        due = (t for r in self.ranks if (t := r.proc.pacer.next_due()) is not None)
        return min(due, default=None)

    def _on_exit(self, rank: int) -> None:
        r = self.ranks[rank]
        status = r.proc.poll()
        if status is None or r.exited:
            return
        r.exited = True
        self.selector.unregister(r.proc.pidfd)
        for _ in range(_DRAIN_ROUNDS):  # a RankDone sent just before exiting
            if r.hung_up or not self._on_message(rank):
                break
        for stream in list(r.proc.pipes):
            self._on_output(rank, stream)
        if self.finished:  # reported already, as every rank had returned
            if status != 0:
                log(f"run {self.spec.run_id}: rank {rank} exited with {status} after its result")
            return
        r.state = self._classify_exit(rank, status)
        self.emit(
            RankFinished(
                self.spec.run_id,
                rank,
                r.state,
                status,
                signal_name(status),
                time.time(),
                r.summary,
            )
        )
        if all(x.exited for x in self.ranks):
            self._finish()

    def _classify_exit(self, rank: int, status: int) -> RankState:
        """The state a rank ends in; a rank that ended on its own while running fails the run."""
        state = self.ranks[rank].state
        if state in (RankState.DONE, RankState.FAILED):
            return state
        if self.stopping:
            return RankState.STOPPED
        under_way = self._stop_under_way()
        if under_way is not None:  # the cancel or timeout came first: it is the run's end,
            self._stop(*under_way)  # and a cancel or timeout is never retried
            return RankState.STOPPED
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

    def cancel(self, reason: str, force: bool = False) -> None:
        """The first cancel asks the ranks to stop (with ``stop_grace``); a second one, or
        ``force``, stops them at once."""
        if force or self.asked is not None:
            self._stop(RunStatus.CANCELLED, reason)
        else:
            self.request_stop(RunStatus.CANCELLED, reason)

    def take_stacks(self) -> None:
        request_stacks(self.spec.paths, self.procs(), self._live(), self._dumps)

    @property
    def _dumps(self) -> bool:
        """Whether the ranks dump their flight recorder with their stacks: NCCL's answers
        during a hang; gloo's (CPU mode) would wait for the collective in progress."""
        return self.spec.device != "cpu"

    def _live(self) -> list[int]:
        """Ranks that run user code and have not exited: they have their stack handler (the
        signal would kill one that does not yet)."""
        return [
            i
            for i, r in enumerate(self.ranks)
            if r.state is not RankState.STARTING and not r.exited
        ]

    def request_stop(self, status: RunStatus, message: str) -> None:
        """Ask the ranks to return (``runtime.should_stop()``) before stopping them; without
        ``stop_grace``, stop them now."""
        if self.stopping or self.finished or self.asked is not None:
            return
        if self.stop_grace <= 0:
            self._stop(status, message)
            return
        if not request_stop(self.procs(), [r for r in self._running() if r in self._live()]):
            self._stop(status, message)  # no rank can take the request (none has started, or
            return  # its code reset the handler): waiting would only delay the stop
        self.asked = (status, message)
        self.ask_deadline = time.monotonic() + self.stop_grace

    def _stop(self, status: RunStatus, message: str = "") -> None:
        if self.stopping or self.finished:
            return
        self.status = status
        self.message = message
        self.unfinished = tuple(self._running())
        for r in self.ranks:
            if not r.exited and r.state is not RankState.FAILED:  # one that raised is exiting
                kill_group(r.proc.pid, signal.SIGTERM)
        self.kill_deadline = time.monotonic() + self.grace

    def tick(self, now: float, read_output: bool = True) -> None:
        """Timers: paused output streams, idle partial lines, the timeout, the SIGKILL after
        the grace period. ``read_output=False`` while the caller is not reading."""
        self._guarded(self._tick, now, read_output)

    def _tick(self, now: float, read_output: bool) -> None:
        if read_output:
            self._read_due_output(now)
        self._timers(now)
        if self.kill_deadline is not None and now >= self.kill_deadline:
            for r in self.ranks:
                if not r.exited:
                    kill_group(r.proc.pid, signal.SIGKILL)

    def _timers(self, now: float) -> None:
        """The timeout (stacks first, then the stop) and the end of ``stop_grace``."""
        busy = self.stopping or self.finished or self.asked is not None
        if self.deadline is not None and now >= self.deadline and not busy and not self.capture:
            self.deadline = None
            self.capture = StackCapture(self.spec.paths, self.procs(), self._live(), self._dumps)
        if self.capture is not None and now >= self.capture.due:
            self.capture.finish()
            self.capture = None
            self.request_stop(*self._timed_out())
        if self.asked is not None and self.ask_deadline is not None and now >= self.ask_deadline:
            self.ask_deadline = None
            self._stop(*self.asked)

    def _timed_out(self) -> tuple[RunStatus, str]:
        limit = self.spec.timeout or 0.0
        running = ", ".join(map(str, self._running()))
        return (
            RunStatus.TIMED_OUT,
            f"exceeded its timeout of {limit:g} s; ranks still running: {running}",
        )

    def _stop_under_way(self) -> tuple[RunStatus, str] | None:
        """The cancel or timeout being carried out (its stacks taken, its ranks asked to stop)
        before the ranks are stopped: what a rank's exit then is part of."""
        if self.asked is not None:
            return self.asked
        return self._timed_out() if self.capture is not None else None

    def _read_due_output(self, now: float) -> None:
        for rank, proc in enumerate(self.procs()):
            for stream in proc.pacer.due(now):
                self._on_output(rank, stream)
            for stream, splitter in proc.splitters.items():
                open_stream = stream in proc.pipes and not self.finished
                piece = splitter.flush_idle(now) if open_stream else None
                if piece:
                    self.emit(OutputLines(self.spec.run_id, rank, stream, (piece,), time.time()))

    def _finish(self) -> None:
        root: int | None = None
        cause = ""
        first = root_cause(self.failures)
        if self.run_failure is not None and (first is None or self.run_failure[0] <= first[0]):
            self.status = RunStatus.FAILED
            self.message = self.run_failure[1]
        elif first is not None and self.status is RunStatus.FAILED:
            _when, root, cause = first
            self.message = f"rank {root} {cause}"
        elif not self.stopping:
            self.status = RunStatus.SUCCEEDED
            if self.asked is not None:
                self.message = f"stopped early ({self.asked[1]}); every rank returned"
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
        for r in self.ranks:
            if r.proc.exit_status is not None:
                r.exited = True
        if not self.finished:
            self._finish()

    def close(self) -> None:
        for proc in self.procs():
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
