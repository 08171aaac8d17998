"""One run's lifecycle, from its ranks' start to its end, without I/O: every backend's.

Inputs are what the transport saw (a rank started, returned, failed, exited; a tick of the
clock; a cancel; stacks wanted); outputs are :mod:`run_actions` (send the specs, take stacks,
ask to stop, TERM, KILL, emit an event). Time is an input (:class:`Instant`): nothing here
reads a clock, waits, or touches a process.

Root cause = the first failure in time (``wire/outcome.py``). Any failure, a timeout or a
cancel stops every other rank at once (TERM, then KILL after ``grace``), but for a rank past
the user's code, which may finish sending what it logged and its answer (``report_s``). A
timeout takes the ranks' stacks first; with ``stop_grace`` a timeout or a cancel asks the
ranks to return before they are stopped. A transport that sees each rank's exit (the
launcher) reports a run at its last exit, or as soon as every rank returned; one that does not
(Ray: a rank's end is its call's answer) reports it when it says the run is over
(:meth:`RunMachine.end`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from serverless_gpu.common.errors import RankFailure, signal_name
from serverless_gpu.common.timeout_words import ranks_timeout
from serverless_gpu.lifecycle.run_actions import (
    Action,
    AskStop,
    CaptureStacks,
    DrainOutput,
    Emit,
    Instant,
    Kill,
    Release,
    RequestStacks,
    SaveStacks,
    SendSpecs,
    Terminate,
)
from serverless_gpu.wire.events import RankFinished, RankStarted, RankState, RunStatus
from serverless_gpu.wire.outcome import RunOutcome

RELEASE_GRACE_S = 5.0
"""How long ranks that all returned may take to exit (communicator and CUDA teardown)."""
REPORT_S = 5.0
"""How long a rank past the user's code may take to send what it logged and its answer
when a peer's failure, the timeout or a cancel stops the run."""


class RunPhase(enum.Enum):
    """The phases a run goes through, in this order (a run may skip some)."""

    STARTING = "starting"
    """Its ranks are being made; their specs wait (for the launcher to unhold them, for standby
    ranks to say whether they hold their process group, for Ray's actors)."""
    RUNNING = "running"
    """The ranks have their specs: they run the call."""
    TAKING_STACKS = "taking stacks"
    """The timeout struck: the ranks' stacks are taken before they are stopped."""
    ASKED = "asked to stop"
    """The ranks were asked to return (a cancel or the timeout, with ``stop_grace``)."""
    STOPPING = "stopping"
    """Every rank was sent SIGTERM (SIGKILL after the grace period), one past the user's code
    once it has reported or ``report_s`` is over; it ends at the last exit."""
    REPORTED = "reported"
    """``RunFinished`` is out. On success that is as soon as every rank has reported its
    result; the ranks then exit (communicator and CUDA teardown) on their own time."""


_ENDING = (RunPhase.STOPPING, RunPhase.REPORTED)


@dataclass(frozen=True)
class Timing:
    """A run's time limits, in seconds."""

    timeout: float | None
    """The call's timeout (None: none)."""
    stop_grace: float = 0.0
    """How long ranks asked to stop may take to return (0: they are not asked)."""
    grace: float = 1.0
    """From TERM to KILL."""
    capture_s: float = 1.5
    """How long the timeout's stacks are waited for (less if the backend says they are in)."""
    release_s: float = RELEASE_GRACE_S
    report_s: float = REPORT_S


@dataclass
class RankRecord:
    """One rank, as the machine follows it."""

    state: RankState = RankState.STARTING
    summary: str = ""
    """What it returned (type, shape) or how it failed, in one line."""
    exited: bool = False
    """Its end was seen: its exit (launcher), or its call's answer or loss (Ray)."""
    reporting: bool = False
    """Past the user's code: it sends what it logged, then its answer."""

    @property
    def running(self) -> bool:
        """Not yet returned or failed: what a stop interrupts."""
        return self.state in (RankState.STARTING, RankState.RUNNING)


class RunMachine:
    """One run's state; each input returns the actions it calls for, in order."""

    def __init__(
        self, run_id: str, world_size: int, timing: Timing, at: Instant, reports_exits: bool = True
    ) -> None:
        self.run_id = run_id
        self.timing = timing
        self.reports_exits = reports_exits
        """The transport sees each rank's exit (``rank_exited``), after its answer."""
        self.ranks = [RankRecord() for _ in range(world_size)]
        self.phase = RunPhase.STARTING
        self.outcome = RunOutcome(run_id)
        self.unfinished: tuple[int, ...] = ()
        """Ranks that were still running when the run was stopped."""
        self.deadline = None if timing.timeout is None else at.mono + timing.timeout
        """When the call's timeout strikes; None once it has (or without one)."""
        self.stacks_due: float | None = None
        """While the timeout's stacks are awaited: when their wait is over."""
        self.asked: tuple[RunStatus, str] | None = None
        """The stop the ranks were asked for (graceful stop), and its reason."""
        self.ask_deadline: float | None = None
        self.kill_deadline: float | None = None
        self.held: set[int] = set()
        """Ranks past the user's code that a stop lets finish reporting, until ``report_due``."""
        self.report_due: float | None = None
        self._out: list[Action] = []

    # -- what the backend reads ------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """``RunFinished`` is out (see ``RunPhase.REPORTED``)."""
        return self.phase is RunPhase.REPORTED

    @property
    def stopped(self) -> bool:
        """A failure, the timeout or a cancel stopped the run."""
        return self.outcome.stopped

    @property
    def all_exited(self) -> bool:
        return all(r.exited for r in self.ranks)

    def state(self, rank: int) -> RankState:
        return self.ranks[rank].state

    def live(self) -> tuple[int, ...]:
        """Ranks that run user code and have not exited: they can take a signal (one still
        starting has no handler for it yet)."""
        return tuple(
            i
            for i, r in enumerate(self.ranks)
            if r.state is not RankState.STARTING and not r.exited
        )

    def _running(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.ranks) if r.running)

    def _take(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _emit(self, event: object) -> None:
        self._out.append(Emit(event))

    def _rank_finished(self, rank: int, at: Instant, status: int | None = None) -> None:
        r = self.ranks[rank]
        name = None if status is None else signal_name(status)
        self._emit(RankFinished(self.run_id, rank, r.state, status, name, at.wall, r.summary))

    # -- inputs: the ranks -----------------------------------------------------------------------

    def may_start(self, warm: bool = False) -> list[Action]:
        """Every rank may get its spec now (the backend's preconditions are met)."""
        if self.phase is RunPhase.STARTING:
            self.phase = RunPhase.RUNNING
            self._out.append(SendSpecs(warm))
        return self._take()

    def rank_started(self, rank: int, pid: int, at: Instant, node: str = "") -> list[Action]:
        """The rank is in the user's function."""
        self.ranks[rank].state = RankState.RUNNING
        self._emit(RankStarted(self.run_id, rank, pid, at.wall, node))
        return self._take()

    def rank_reporting(self, rank: int, at: Instant) -> list[Action]:
        """The user's code in the rank returned or raised: it sends what it logged and its
        answer now, which a stop lets it finish (for ``report_s``)."""
        r = self.ranks[rank]
        if r.running:
            r.reporting = True
        return self._take()

    def rank_done(
        self, rank: int, summary: str, failure: RankFailure | None, at: Instant
    ) -> list[Action]:
        """The rank returned (``failure`` None) or raised: its answer, before its exit."""
        r = self.ranks[rank]
        r.summary = summary
        r.state = RankState.DONE if failure is None else RankState.FAILED
        if rank in self.held:  # it has reported: stopped now (one that raised exits itself)
            self.held.discard(rank)
            if failure is None:
                self._terminate((rank,), at)
        if failure is not None:
            self.outcome.rank_failed(failure)
        if not self.reports_exits:  # its answer is its end
            r.exited = True
            self._rank_finished(rank, at)
        if failure is not None:
            self._stop(RunStatus.FAILED, "", at)
        elif self.reports_exits and all(x.state is RankState.DONE for x in self.ranks):
            self._succeeded(at)
        return self._take()

    def _succeeded(self, at: Instant) -> None:
        """Every rank has written its result: the caller gets them now, not after the ranks'
        teardown. Output the ranks wrote before their result goes first."""
        if self.phase in _ENDING:
            return
        self._out.append(Release())
        self.kill_deadline = at.mono + self.timing.release_s
        for rank in range(len(self.ranks)):
            self._out.append(DrainOutput(rank))
            self._rank_finished(rank, at)
        self._finish(at)

    def rank_exited(self, rank: int, status: int, at: Instant) -> list[Action]:
        """The rank's process ended with ``status`` (a Popen-style return code)."""
        r = self.ranks[rank]
        if r.exited:
            return []
        r.exited = True
        if self.finished:  # reported already, as every rank had returned
            return []
        r.state = self._classify_exit(rank, status, at)
        if rank in self.held:  # it ended before it had reported
            self.held.discard(rank)
            if r.state is RankState.STOPPED:
                self.unfinished = (*self.unfinished, rank)
        self._rank_finished(rank, at, status)
        if self.all_exited:
            self._finish(at)
        return self._take()

    def _classify_exit(self, rank: int, status: int, at: Instant) -> RankState:
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
                self.outcome.rank_failed(RankFailure.of_exit(rank, at.wall, status))
                return RankState.FAILED
            return RankState.STOPPED
        under_way = self._stop_under_way()
        if under_way is not None:  # the cancel or timeout came first: it is the run's end,
            self._stop(*under_way, at)  # and a cancel or timeout is never retried
            return RankState.STOPPED
        self.outcome.rank_failed(RankFailure.of_exit(rank, at.wall, status))
        self._stop(RunStatus.FAILED, "", at)
        return RankState.FAILED

    def rank_lost(self, rank: int, summary: str, failure: RankFailure, at: Instant) -> list[Action]:
        """The rank's process died with no status to read (a Ray actor, its node): a failure,
        unless the run was stopped and the rank was not running."""
        r = self.ranks[rank]
        if self.stopped and r.state is not RankState.RUNNING:
            return []
        r.state, r.summary, r.exited = RankState.FAILED, summary, True
        self.outcome.rank_failed(failure)
        self._rank_finished(rank, at)
        self._stop(RunStatus.FAILED, "", at)
        return self._take()

    def _stopped_for_failure(self) -> bool:
        return self.outcome.stop is not None and self.outcome.stop[0] is RunStatus.FAILED

    # -- inputs: the caller and the clock --------------------------------------------------------

    def run_failed(self, message: str, at: Instant) -> list[Action]:
        """The run itself failed (not one rank: its supervision, its placement): stop every
        rank, report ``message`` (unless the run was stopped already: that is its end)."""
        if self.phase not in _ENDING:
            self.outcome.run_failed(at.wall, message)
        self._stop(RunStatus.FAILED, message, at)
        return self._take()

    def cancel(self, reason: str, at: Instant, force: bool = False) -> list[Action]:
        """The first cancel asks the ranks to stop (with ``stop_grace``); a second one, or
        ``force``, stops them at once."""
        if force or self.asked is not None:
            self._stop(RunStatus.CANCELLED, reason, at)
        else:
            self._request_stop(RunStatus.CANCELLED, reason, at)
        return self._take()

    def stacks_wanted(self) -> list[Action]:
        """Stacks of the ranks that can give them, now (changes nothing: any thread may ask)."""
        return [RequestStacks(self.live())]

    def stacks_in(self, at: Instant) -> list[Action]:
        """Every rank asked for the timeout's stacks has answered: no need to wait longer."""
        if self.stacks_due is not None:
            self.stacks_due = min(self.stacks_due, at.mono)
        return self.tick(at)

    def ask_refused(self, at: Instant) -> list[Action]:
        """None of the ranks of ``AskStop`` could be asked (their code reset the handler):
        they are stopped now."""
        asked, self.asked, self.ask_deadline = self.asked, None, None
        if asked is not None:
            self._stop(*asked, at)
        return self._take()

    def tick(self, at: Instant) -> list[Action]:
        """Timers: the timeout (stacks first, then the stop), the end of ``stop_grace``, the
        KILL after the grace period."""
        now = at.mono
        started = self.phase in (RunPhase.STARTING, RunPhase.RUNNING)
        if started and self.deadline is not None and now >= self.deadline:
            self.deadline = None
            self.phase = RunPhase.TAKING_STACKS
            live = self.live()
            self.stacks_due = now + (self.timing.capture_s if live else 0.0)
            self._out.append(CaptureStacks(live))
        if self.stacks_due is not None and now >= self.stacks_due:
            self.stacks_due = None
            self._out.append(SaveStacks())
            self._request_stop(*self._timed_out(), at)
        if self.asked is not None and self.ask_deadline is not None and now >= self.ask_deadline:
            self.ask_deadline = None
            self._stop(*self.asked, at)
        if self.report_due is not None and now >= self.report_due:
            self.report_due = None
            late, self.held = tuple(sorted(self.held)), set()
            if late:  # they did not finish reporting in time: stopped as the others were
                self.unfinished = tuple(sorted({*self.unfinished, *late}))
                self._terminate(late, at)
        if self.kill_deadline is not None and now >= self.kill_deadline:
            left = tuple(i for i, r in enumerate(self.ranks) if not r.exited and i not in self.held)
            if left:
                self._out.append(Kill(left))
        return self._take()

    def end(self, at: Instant, announce: Iterable[int] = ()) -> list[Action]:
        """The backend is done with the run (Ray's run is over; the launcher shuts down):
        ranks still running are stopped, those in ``announce`` say so, the run is reported."""
        if self.finished:
            return []
        if self.stacks_due is not None:  # a failure came during the timeout's capture
            self.stacks_due = None
            self._out.append(SaveStacks())
        said = set(announce)
        for rank, r in enumerate(self.ranks):
            if r.running:
                r.state = RankState.STOPPED
                if rank in said:
                    self._rank_finished(rank, at)
        if not self.reports_exits:  # nothing changes after a stop here but the ranks' ends
            self.unfinished = tuple(
                i for i, r in enumerate(self.ranks) if r.state is RankState.STOPPED
            )
        self._finish(at)
        return self._take()

    # -- stopping --------------------------------------------------------------------------------

    def _request_stop(self, status: RunStatus, message: str, at: Instant) -> None:
        """Ask the ranks to return (``runtime.should_stop()``) before stopping them; without
        ``stop_grace``, or when no rank can take the request, stop them now."""
        if self.phase in (RunPhase.ASKED, *_ENDING):
            return
        live = set(self.live())
        which = tuple(r for r in self._running() if r in live)
        if self.timing.stop_grace <= 0 or not which:
            self._stop(status, message, at)
            return
        self.phase = RunPhase.ASKED
        self.asked = (status, message)
        self.ask_deadline = at.mono + self.timing.stop_grace
        self._out.append(AskStop(which))

    def _stop(self, status: RunStatus, message: str, at: Instant) -> None:
        if self.phase in _ENDING:
            return
        self.outcome.stopped_for(status, message)
        self.phase = RunPhase.STOPPING
        # A rank past the user's code is sending what it logged: it may finish (report_s).
        self.held = {i for i, r in enumerate(self.ranks) if r.running and r.reporting}
        if self.held:
            self.report_due = at.mono + self.timing.report_s
        self.unfinished = tuple(i for i in self._running() if i not in self.held)
        # One that raised is exiting on its own.
        term = (
            i
            for i, r in enumerate(self.ranks)
            if not r.exited and r.state is not RankState.FAILED and i not in self.held
        )
        self._out.append(Terminate(tuple(term)))
        self.kill_deadline = at.mono + self.timing.grace

    def _terminate(self, ranks: tuple[int, ...], at: Instant) -> None:
        """Stop ``ranks`` later than the others (KILL after their own grace)."""
        self._out.append(Terminate(ranks))
        self.kill_deadline = max(self.kill_deadline or 0.0, at.mono + self.timing.grace)

    def _timed_out(self) -> tuple[RunStatus, str]:
        states = enumerate(r.state for r in self.ranks)
        return RunStatus.TIMED_OUT, ranks_timeout(self.timing.timeout or 0.0, states)

    def _stop_under_way(self) -> tuple[RunStatus, str] | None:
        """The cancel or timeout being carried out (its stacks taken, its ranks asked to stop)
        before the ranks are stopped: what a rank's exit then is part of."""
        if self.phase is RunPhase.ASKED:
            return self.asked
        return self._timed_out() if self.phase is RunPhase.TAKING_STACKS else None

    def _finish(self, at: Instant) -> None:
        asked = self.asked
        note = f"stopped early ({asked[1]}); every rank returned" if asked else ""
        self.phase = RunPhase.REPORTED
        self._emit(self.outcome.finished(self.unfinished, at.wall, note))
