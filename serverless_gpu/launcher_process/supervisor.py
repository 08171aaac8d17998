"""Supervising one call's ranks inside the launcher: the per-run state machine.

Root cause = the first failure in time (``wire/outcome.py``). Any failure, a timeout or a cancel
stops every other rank at once (the stop ladder: TERM, then KILL after the grace period), also
ranks blocked in a collective. The ranks' output is ``rank_output.py``'s.
"""

from __future__ import annotations

import enum
import functools
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serverless_gpu.common.errors import RankFailure, signal_name
from serverless_gpu.common.timeout_words import ranks_timeout
from serverless_gpu.launcher_process.log import log, log_exception
from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.launcher_process.rank_output import RankOutput
from serverless_gpu.launcher_process.stop_ladder import StopLadder
from serverless_gpu.launcher_process.stop_signals import request_stacks
from serverless_gpu.wire.channel import Undecodable
from serverless_gpu.wire.events import (
    RankFinished,
    RankMessage,
    RankStarted,
    RankState,
    RunStatus,
    ends_cell,
)
from serverless_gpu.wire.outcome import RunOutcome
from serverless_gpu.wire.protocol import (
    GroupReady,
    RankDone,
    RankSpec,
    ToCaller,
    UserCodeStarted,
)
from serverless_gpu.wire.runspec import RunSpec

_DRAIN_ROUNDS = 64
"""Reads of an exited rank's channel (16 MiB each) before its last messages are given up."""


class RunPhase(enum.Enum):
    """The phases a run goes through in the launcher, in this order (a run may skip some)."""

    STARTING = "starting"
    """Its ranks are forked; their specs wait (for the launcher to unhold them, or for standby
    ranks to say whether they hold their process group)."""
    RUNNING = "running"
    """The ranks have their specs: they run the call."""
    TAKING_STACKS = "taking stacks"
    """The timeout struck: the ranks' stacks are taken before they are stopped."""
    ASKED = "asked to stop"
    """The ranks were asked to return (a cancel or the timeout, with ``stop_grace``)."""
    STOPPING = "stopping"
    """Every rank was sent SIGTERM (SIGKILL after the grace period); it ends at the last exit."""
    REPORTED = "reported"
    """``RunFinished`` is sent. On success that is as soon as every rank has reported its
    result; the ranks then exit (communicator and CUDA teardown) on their own time, still
    supervised until ``all_exited``."""


_ENDING = (RunPhase.STOPPING, RunPhase.REPORTED)


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
        """The launcher's: specs wait (ranks of a finished run still exit on our devices)."""
        self.devices_freed = False
        """The launcher's: it has handed this run's devices on (once its results were out)."""
        self.ranks = [_Rank(proc) for proc in ranks]
        self.master_port = master_port
        self.emit = emit
        self.selector = selector
        self.phase = RunPhase.STARTING
        self.outcome = RunOutcome(spec.run_id)
        self.unfinished: tuple[int, ...] = ()
        """Ranks that were still running when the run was stopped."""
        self.ladder = StopLadder(spec, ranks)
        self.output = RankOutput(spec, ranks, emit, selector, self._guarded, self.fail)

    @property
    def finished(self) -> bool:
        """``RunFinished`` has been sent (see ``RunPhase.REPORTED``)."""
        return self.phase is RunPhase.REPORTED

    def start(self) -> None:
        for rank, proc in enumerate(self.procs()):
            proc.channel.attach(
                self.selector, functools.partial(self._guarded, self._on_message, rank)
            )
            self.selector.register(proc.pidfd, selectors.EVENT_READ, self._cb(self._on_exit, rank))
            self.output.attach(rank)
        self._send_specs()

    def unhold(self) -> None:
        self.held = False
        self._send_specs()

    def _send_specs(self) -> None:
        """Start the call in every rank, once they may: grouped ranks have said whether they
        hold their group (the call takes it only if all do)."""
        waiting = self.grouped and any(r.group_ready is None for r in self.ranks)
        if self.phase is not RunPhase.STARTING or self.held or waiting:
            return
        self.phase = RunPhase.RUNNING
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
        if self.phase not in _ENDING:
            self.outcome.run_failed(time.time(), message)
        self._stop(RunStatus.FAILED, message)

    # -- events from the ranks -------------------------------------------------------------------

    def _on_message(self, rank: int) -> bool:
        """Handle what the rank's channel holds; True while more may wait (large messages)."""
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
        elif isinstance(message, RankDone):
            self._rank_done(rank, message)
        elif isinstance(message, ToCaller):
            if ends_cell(message.data):  # a session cell's output goes before its end
                self.output.read_all(rank)
            self.emit(RankMessage(self.spec.run_id, rank, message.kind, message.data, message.time))

    def _rank_done(self, rank: int, message: RankDone) -> None:
        r = self.ranks[rank]
        r.summary = message.summary
        if not message.ok:
            r.state = RankState.FAILED
            self.outcome.rank_failed(message.failure or _unsaid(rank, message))
            self._stop(RunStatus.FAILED)
            return
        r.state = RankState.DONE
        if all(x.state is RankState.DONE for x in self.ranks) and self.phase not in _ENDING:
            self.ladder.release()
            self._report_success()

    def _report_success(self) -> None:
        """Every rank has written its result: the caller gets them now, not after the ranks'
        teardown. Output the ranks wrote before their result goes first."""
        for rank, r in enumerate(self.ranks):
            self.output.flush(rank)
            self.emit(
                RankFinished(self.spec.run_id, rank, r.state, None, None, time.time(), r.summary)
            )
        self._finish()

    def next_wake(self) -> float | None:
        """When a paused output stream is due to be read (see OutputPacer)."""
        return self.output.next_wake()

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
        self.output.read_all(rank)
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
        if self.all_exited:
            self._finish()

    def _classify_exit(self, rank: int, status: int) -> RankState:
        """The state a rank ends in; a rank that ended on its own while running fails the run."""
        state = self.ranks[rank].state
        if state in (RankState.DONE, RankState.FAILED):
            return state
        if self.phase is RunPhase.STOPPING:
            if status > 0 and self._stopped_for_failure():
                # An exit code, not our SIGTERM (ranks keep its default: a signal status): the
                # rank ended on its own, typically the crashed peer behind a survivor's
                # "connection reset by peer", whose exit the launcher got to only after that
                # error. It is a failure of its own, and errors.root_cause ranks it first.
                self.outcome.rank_failed(RankFailure.of_exit(rank, time.time(), status))
                return RankState.FAILED
            return RankState.STOPPED
        under_way = self._stop_under_way()
        if under_way is not None:  # the cancel or timeout came first: it is the run's end,
            self._stop(*under_way)  # and a cancel or timeout is never retried
            return RankState.STOPPED
        self.outcome.rank_failed(RankFailure.of_exit(rank, time.time(), status))
        self._stop(RunStatus.FAILED)
        return RankState.FAILED

    def _stopped_for_failure(self) -> bool:
        return self.outcome.stop is not None and self.outcome.stop[0] is RunStatus.FAILED

    # -- stopping ----------------------------------------------------------------------------------

    def cancel(self, reason: str, force: bool = False) -> None:
        """The first cancel asks the ranks to stop (with ``stop_grace``); a second one, or
        ``force``, stops them at once."""
        if force or self.ladder.asked is not None:
            self._stop(RunStatus.CANCELLED, reason)
        else:
            self.request_stop(RunStatus.CANCELLED, reason)

    def take_stacks(self) -> None:
        request_stacks(self.spec.paths, self.procs(), self._live(), self.ladder.dumps)

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
        ``stop_grace``, or when no rank can take the request, stop them now."""
        if self.phase in (RunPhase.ASKED, *_ENDING):
            return
        live = self._live()
        if self.ladder.ask(status, message, [r for r in self._running() if r in live]):
            self.phase = RunPhase.ASKED
        else:
            self._stop(status, message)

    def _stop(self, status: RunStatus, message: str = "") -> None:
        if self.phase in _ENDING:
            return
        self.outcome.stopped_for(status, message)
        self.phase = RunPhase.STOPPING
        self.unfinished = tuple(self._running())
        # One that raised is exiting on its own.
        self.ladder.term(
            i for i, r in enumerate(self.ranks) if not r.exited and r.state is not RankState.FAILED
        )

    def tick(self, now: float, read_output: bool = True) -> None:
        """Timers: paused output streams, idle partial lines, the timeout, the SIGKILL after
        the grace period. ``read_output=False`` while the caller is not reading."""
        self._guarded(self._tick, now, read_output)

    def _tick(self, now: float, read_output: bool) -> None:
        if read_output:
            self.output.read_due(now)
        self._timers(now)
        self.ladder.kill_if_due(now, [i for i, r in enumerate(self.ranks) if not r.exited])

    def _timers(self, now: float) -> None:
        """The timeout (stacks first, then the stop) and the end of ``stop_grace``."""
        started = self.phase in (RunPhase.STARTING, RunPhase.RUNNING)
        if started and self.ladder.timeout_struck(now):
            self.phase = RunPhase.TAKING_STACKS
            self.ladder.take_stacks(self._live())
        if self.ladder.stacks_taken(now):
            self.request_stop(*self._timed_out())
        asked = self.ladder.ask_expired(now)
        if asked is not None:
            self._stop(*asked)

    def _timed_out(self) -> tuple[RunStatus, str]:
        states = enumerate(r.state for r in self.ranks)
        return RunStatus.TIMED_OUT, ranks_timeout(self.spec.timeout or 0.0, states)

    def _stop_under_way(self) -> tuple[RunStatus, str] | None:
        """The cancel or timeout being carried out (its stacks taken, its ranks asked to stop)
        before the ranks are stopped: what a rank's exit then is part of."""
        if self.phase is RunPhase.ASKED:
            return self.ladder.asked
        return self._timed_out() if self.phase is RunPhase.TAKING_STACKS else None

    def _finish(self) -> None:
        asked = self.ladder.asked
        note = f"stopped early ({asked[1]}); every rank returned" if asked else ""
        self.phase = RunPhase.REPORTED
        self.output.to_logs_only = True
        self.emit(self.outcome.finished(self.unfinished, time.time(), note))

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
        self.output.close()


def _unsaid(rank: int, message: RankDone) -> RankFailure:
    """A failed ``RankDone`` that did not say how (the rank's own code always does)."""
    what = message.summary or "failed without saying how"
    return RankFailure(rank, message.time, None, None, what, detail=what)
