"""Supervising one call's ranks inside the launcher: the run machine's adapter.

The run's lifecycle (phases, timers, the outcome and its root cause) is the run machine's
(``lifecycle/run_machine.py``), shared with the Ray backend: this class turns what the select
loop sees (rank messages, pidfd exits, ticks, the caller's cancel) into its inputs, and its
actions into the ranks' channels and signals (``stop_ladder.py``). The ranks' output is
``rank_output.py``'s.
"""

from __future__ import annotations

import functools
import selectors
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from serverless_gpu.common.errors import RankFailure
from serverless_gpu.launcher_process.log import log, log_exception
from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.launcher_process.rank_output import RankOutput
from serverless_gpu.launcher_process.stop_ladder import StopLadder
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
from serverless_gpu.lifecycle.run_machine import RunMachine, RunPhase, Timing
from serverless_gpu.wire.channel import Undecodable
from serverless_gpu.wire.events import RankMessage, RunFinished, ends_cell
from serverless_gpu.wire.protocol import (
    GroupReady,
    RankDone,
    RankSpec,
    ToCaller,
    UserCodeEnded,
    UserCodeStarted,
)
from serverless_gpu.wire.runspec import CAPTURE_S, RunSpec

_DRAIN_ROUNDS = 64
"""Reads of an exited rank's channel (16 MiB each) before its last messages are given up."""


@dataclass
class _Rank:
    """One rank's process, as the supervisor follows it (its state is the machine's)."""

    proc: RankProcess
    hung_up: bool = False
    """Its channel reached end of file."""
    group_ready: bool | None = None
    """A standby rank forming a process group: whether it holds one (None: not said yet)."""


def _now() -> Instant:
    return Instant(time.monotonic(), time.time())


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
        timing = Timing(spec.timeout, float(spec.config.stop_grace), spec.grace, CAPTURE_S)
        self.machine = RunMachine(spec.run_id, len(ranks), timing, _now())
        self.ladder = StopLadder(spec, ranks)
        self.output = RankOutput(spec, ranks, emit, selector, self._guarded, self.fail)
        self._carry: dict[type, Callable[[Any], None]] = {
            SendSpecs: self._send_specs,
            Emit: self._emit,
            DrainOutput: lambda a: self.output.flush(a.rank),
            CaptureStacks: lambda a: self.ladder.take_stacks(a.ranks),
            SaveStacks: lambda _a: self.ladder.save_stacks(),
            RequestStacks: lambda a: self.ladder.request_stacks(a.ranks),
            AskStop: self._ask,
            Terminate: lambda a: self.ladder.term(a.ranks),
            Kill: lambda a: self.ladder.kill(a.ranks),
            Release: lambda _a: self.ladder.release(),
        }
        """How each of the machine's actions is carried out here."""

    @property
    def phase(self) -> RunPhase:
        return self.machine.phase

    @property
    def finished(self) -> bool:
        """``RunFinished`` has been sent (see ``RunPhase.REPORTED``)."""
        return self.machine.finished

    @property
    def all_exited(self) -> bool:
        return self.machine.all_exited

    def _apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self._carry[type(action)](action)

    def _send_specs(self, action: SendSpecs) -> None:
        for rank, proc in enumerate(self.procs()):
            # Buffered: a rank that does not read must not stall the launcher. One that died
            # already is reported through its pidfd.
            proc.channel.send(RankSpec(self.spec, rank, self.master_port, action.warm))

    def _emit(self, action: Emit) -> None:
        if isinstance(action.event, RunFinished):
            self.output.to_logs_only = True  # the ranks' teardown goes to their logs only
        self.emit(action.event)

    def _ask(self, action: AskStop) -> None:
        if not self.ladder.ask(action.ranks):  # none has the handler: stop them now
            self._apply(self.machine.ask_refused(_now()))

    def start(self) -> None:
        for rank, proc in enumerate(self.procs()):
            proc.channel.attach(
                self.selector, functools.partial(self._guarded, self._on_message, rank)
            )
            self.selector.register(proc.pidfd, selectors.EVENT_READ, self._cb(self._on_exit, rank))
            self.output.attach(rank)
        self._may_start()

    def unhold(self) -> None:
        self.held = False
        self._may_start()

    def _may_start(self) -> None:
        """Start the call in every rank, once they may: grouped ranks have said whether they
        hold their group (the call takes it only if all do)."""
        if self.held or (self.grouped and any(r.group_ready is None for r in self.ranks)):
            return
        self._apply(self.machine.may_start(self.grouped and all(r.group_ready for r in self.ranks)))

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
        self._apply(self.machine.run_failed(message, _now()))

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
            self._may_start()
        elif isinstance(message, UserCodeStarted):
            at = Instant(time.monotonic(), message.time)  # the rank's own time
            self._apply(self.machine.rank_started(rank, r.proc.pid, at))
        elif isinstance(message, UserCodeEnded):
            self._apply(self.machine.rank_reporting(rank, _now()))
        elif isinstance(message, RankDone):
            failure = None if message.ok else message.failure or _unsaid(rank, message)
            self._apply(self.machine.rank_done(rank, message.summary, failure, _now()))
        elif isinstance(message, ToCaller):
            if ends_cell(message.data):  # a session cell's output goes before its end
                self.output.read_all(rank)
            self.emit(RankMessage(self.spec.run_id, rank, message.kind, message.data, message.time))

    def next_wake(self) -> float | None:
        """When a paused output stream is due to be read (see OutputPacer)."""
        return self.output.next_wake()

    def _on_exit(self, rank: int) -> None:
        r = self.ranks[rank]
        status = r.proc.poll()
        if status is None or self.machine.ranks[rank].exited:
            return
        self.selector.unregister(r.proc.pidfd)
        for _ in range(_DRAIN_ROUNDS):  # a RankDone sent just before exiting
            if r.hung_up or not self._on_message(rank):
                break
        self.output.read_all(rank)
        if self.finished and status != 0:  # reported already, as every rank had returned
            log(f"run {self.spec.run_id}: rank {rank} exited with {status} after its result")
        self._apply(self.machine.rank_exited(rank, status, _now()))

    # -- stopping ----------------------------------------------------------------------------------

    def cancel(self, reason: str, force: bool = False) -> None:
        """The first cancel asks the ranks to stop (with ``stop_grace``); a second one, or
        ``force``, stops them at once."""
        self._apply(self.machine.cancel(reason, _now(), force))

    def take_stacks(self) -> None:
        self._apply(self.machine.stacks_wanted())

    def tick(self, now: float, read_output: bool = True) -> None:
        """Timers: paused output streams, idle partial lines, the run machine's (the timeout,
        the end of ``stop_grace``, the SIGKILL after the grace period). ``read_output=False``
        while the caller is not reading."""
        self._guarded(self._tick, now, read_output)

    def _tick(self, now: float, read_output: bool) -> None:
        if read_output:
            self.output.read_due(now)
        self._apply(self.machine.tick(Instant(now, time.time())))

    def finish_now(self) -> None:
        """For launcher shutdown: every rank has been reaped outside the select loop."""
        self._apply(self.machine.end(_now()))

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
