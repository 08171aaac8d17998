"""The launcher process: one per caller, started fresh, torch preloaded, never touches CUDA.

It forks one process per rank per call (legal and cheap: no CUDA context, no threads here),
supervises them (exit codes, timeouts, cancel, TERM -> KILL), tees their output to log files and
the event stream, and dies with its caller: EOF on the caller's socket ends it, and so does the
caller's exit seen through a pidfd, and the parent-death signal.

No peer can block it: every channel is non-blocking (``channel.py``). Only the end of the
caller's socket (or the caller's exit) means the caller is gone; any other error while
handling a message fails that message's run with its cause, and the launcher stays up.

This module is the select loop; admitting runs (queue, devices, ranks) is ``admission.py``,
reaping children ``reaping.py``, the process's start ``__main__.py``.
"""

from __future__ import annotations

import importlib
import selectors
import shutil
import sys
import time
from typing import Any

from serverless_gpu.common.lifetime import terminate_groups
from serverless_gpu.launcher_process import reaping
from serverless_gpu.launcher_process.admission import Admission, StartFailed
from serverless_gpu.launcher_process.allocation import Allocator
from serverless_gpu.launcher_process.log import log, log_exception
from serverless_gpu.launcher_process.standby import RankSet, Standby, fork_set
from serverless_gpu.launcher_process.supervisor import RunSupervisor
from serverless_gpu.wire.channel import Channel, Undecodable
from serverless_gpu.wire.events import RunFinished
from serverless_gpu.wire.protocol import (
    CancelRun,
    Exiting,
    Prewarm,
    RankGroups,
    Shutdown,
    TakeStacks,
)
from serverless_gpu.wire.runspec import RunSpec

_TICK_S = 0.05
CALLER_BACKLOG_BYTES = 64 << 20
"""Events queued for the caller beyond which the ranks' output is left in their pipes."""
_REAP_AT_EXIT_S = 10.0
"""How long shutdown waits for SIGKILLed ranks to be gone (a GPU driver's teardown)."""
_FLUSH_AT_EXIT_S = 2.0
"""How long the last events may wait for a caller that does not read, at shutdown."""
_SHUTTING_DOWN = "the launcher is shutting down"


class LauncherLoop:
    """The select loop: caller messages, rank messages, rank output, rank exits, timers."""

    def __init__(self, caller: Channel, caller_pidfd: int | None = None) -> None:
        self.caller = caller
        self.selector = selectors.DefaultSelector()
        caller.attach(self.selector, self._on_caller)
        self.backlog_selector = selectors.DefaultSelector()
        """Watches only the caller, while it has too much unread (see _wait_for_caller)."""
        self.backlog_selector.register(
            caller.fileno(), selectors.EVENT_READ | selectors.EVENT_WRITE
        )
        if caller_pidfd is not None:
            self.selector.register(caller_pidfd, selectors.EVENT_READ, self._on_caller_exit)
            self.backlog_selector.register(caller_pidfd, selectors.EVENT_READ)
        self.reported_groups: tuple[int, ...] = ()
        self.admission = Admission(self.emit, self.selector, self._report_groups)
        self.preload: set[str] = set()
        self.running = True

    @property
    def runs(self) -> dict[str, RunSupervisor]:
        """The runs started and not closed yet, by id."""
        return self.admission.runs

    @property
    def standby(self) -> Standby:
        return self.admission.standby

    @property
    def allocator(self) -> Allocator:
        return self.admission.allocator

    # -- loop --------------------------------------------------------------------------------

    def serve(self) -> None:
        while self.running:
            backlog = self.caller.pending > CALLER_BACKLOG_BYTES
            if backlog:
                self._wait_for_caller()
            else:
                for key, _ in self.selector.select(timeout=self._timeout()):
                    key.data(key.fileobj)
            now = time.monotonic()
            for run in list(self.runs.values()):
                run.tick(now, not backlog)
                if run.finished and not run.devices_freed:
                    self._free_devices(run)
                if run.finished and run.all_exited:
                    self._close_run(run)
            self.admission.unhold()
            self.admission.expire_queued()
            self.standby.reap()
            reaping.reap_orphans(self.runs.values(), self.standby)
            self._report_groups()

    def _wait_for_caller(self) -> None:
        """The caller is not reading (stopped, busy): read nothing from the ranks until it
        catches up, so their output waits in their pipes (and then blocks them) instead of
        growing here without bound. Timeouts, cancels and the caller's exit still work."""
        for key, events in self.backlog_selector.select(timeout=_TICK_S):
            if key.fd == self.caller.fileno():
                self.caller.flush()
                if events & selectors.EVENT_READ:
                    self._on_caller()
            else:
                self._on_caller_exit(key.fd)

    def _timeout(self) -> float:
        wakes = [t for run in self.runs.values() if (t := run.next_wake()) is not None]
        return min(_TICK_S, max(0.0, min(wakes) - time.monotonic())) if wakes else _TICK_S

    def emit(self, event: Any) -> None:
        """Queue an event for the caller; never blocks (the caller may not be reading)."""
        self.caller.send(event)
        if self.caller.broken:
            self.running = False  # caller gone: shut down after this iteration

    def _report_groups(self) -> None:
        """Tell the caller which rank groups exist, so it can kill them if this process dies
        without doing it (SIGKILL, OOM killer)."""
        groups = tuple(sorted(reaping.known_pids(self.runs.values(), self.standby)))
        if groups != self.reported_groups:
            self.reported_groups = groups
            self.emit(RankGroups(groups))

    # -- caller ------------------------------------------------------------------------------

    def _on_caller(self) -> None:
        # Everything pending is handled before standby ranks are made: a call that arrived
        # together with its Prewarm (decorate, then call at once) must not wait for a standby
        # set to create CUDA contexts it would then sit behind.
        messages, eof = self.caller.receive()
        for message in messages:
            if not self.running:
                break  # shutting down: a RunSpec left unaccepted is retried by the caller
            self._handle_safely(message)
        if eof:
            self.running = False  # the caller died or closed its end: stop everything
            return
        self._refill_standby()

    def _on_caller_exit(self, _fd: Any) -> None:
        """The caller process exited, even if a child it forked still holds our socket."""
        self.running = False

    def _handle_safely(self, message: Any) -> None:
        try:
            self._handle(message)
        except Exception as exc:
            if isinstance(exc, StartFailed):
                text = str(exc)
            else:
                text = f"the launcher could not handle {type(message).__name__}: {exc!r}"
            log_exception(text)
            if isinstance(message, RunSpec):
                run = self.runs.get(message.run_id)
                if run is not None:
                    run.fail(text)
                else:
                    self.emit(RunFinished.run_failed(message.run_id, text, (), time.time()))

    def _handle(self, message: Any) -> None:
        if isinstance(message, Undecodable):
            log(f"a message from the caller could not be loaded: {message.error!r}")
        elif isinstance(message, RunSpec):
            self.admission.start(message)
        elif isinstance(message, CancelRun):
            run = self.runs.get(message.run_id)
            if run is not None:
                run.cancel(message.reason, message.force)
            else:
                self.admission.cancel_queued(message.run_id, message.reason)
        elif isinstance(message, TakeStacks):
            run = self.runs.get(message.run_id)
            if run is not None:
                run.take_stacks()
        elif isinstance(message, Prewarm):
            self._prewarm(message)
        elif isinstance(message, Shutdown):
            self.running = False

    def _prewarm(self, message: Prewarm) -> None:
        self.preload.update(message.preload)
        if message.env is not None:
            self.standby.group_env = message.env
        self.standby.use((message.device, message.world_size), True, message.warm_group)

    # -- standby ranks -------------------------------------------------------------------------

    def _refill_standby(self) -> None:
        """Standby ranks for every shape asked for, made only while no call runs: during a
        call they would hold a CUDA context (and CPU time) on the GPUs the call is using.
        A finished run whose ranks still exit does not count: its results are out."""
        if not self.running or any(not r.finished for r in self.runs.values()):
            return
        if self.allocator.busy():
            return
        try:
            _preload(self.preload)
            self.standby.refill(self._fork_standby)
        except Exception:  # standby ranks are an optimisation: calls fork their own
            log_exception("no standby ranks")
        self._report_groups()

    def _fork_standby(self, shape: tuple[str, int], grouped: bool) -> RankSet:
        cuda = shape[0] == "cuda"
        title = "standby gpu" if cuda else "standby cpu"
        return fork_set(shape, title, self.standby.base_env() if grouped else None, cuda)

    def _free_devices(self, run: RunSupervisor) -> None:
        """The run's results are out: its devices go to the next run (which waits for these
        ranks' exit before its own start), and standby ranks are made for the next call."""
        run.devices_freed = True
        if self.running:
            self.admission.start_queued(run.spec.run_id)
        else:
            self.allocator.release(run.spec.run_id)
        self._refill_standby()

    def _close_run(self, run: RunSupervisor) -> None:
        if not run.devices_freed:
            self._free_devices(run)
        run.close()
        del self.runs[run.spec.run_id]
        if not self.runs:
            reaping.kill_adopted(self.runs.values(), self.standby)
        self._refill_standby()

    # -- shutdown ------------------------------------------------------------------------------

    def _reap_all(self) -> None:
        reaping.reap_all(self.runs.values(), self.standby)

    def shutdown(self) -> None:
        self.running = False  # also stops runs that end now from preparing new standby ranks
        self.emit(Exiting())  # new calls go to a fresh launcher from now on
        for run in self.runs.values():
            run.cancel(_SHUTTING_DOWN, force=True)
        self.admission.end_all_queued(_SHUTTING_DOWN)
        terminate_groups(reaping.live_pids(self.runs.values(), self.standby), 1.0, self._reap_all)
        reaped_by = time.monotonic() + _REAP_AT_EXIT_S
        for run in list(self.runs.values()):
            run.reap_by(reaped_by)
            run.finish_now()
            self._close_run(run)
        standby = self.standby.ranks()
        terminate_groups([r.pid for r in standby if r.alive()], 0.5, reap=self._reap_all)
        reaped_by = time.monotonic() + _REAP_AT_EXIT_S
        for r in standby:
            r.reap_by(reaped_by)
        self.admission.standby = Standby()
        reaping.kill_adopted(self.runs.values(), self.standby)
        self.backlog_selector.close()
        for folder in self.admission.results_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        self._report_groups()
        self._flush_to_caller(_FLUSH_AT_EXIT_S)
        self.caller.close()  # the caller sees the end now, not after the interpreter's exit

    def _flush_to_caller(self, seconds: float) -> None:
        """Hand the last events (the runs' ends) to a caller that reads; bounded."""
        deadline = time.monotonic() + seconds
        self.caller.detach()
        while not self.caller.flush() and time.monotonic() < deadline:
            with selectors.DefaultSelector() as waiter:
                waiter.register(self.caller.fileno(), selectors.EVENT_WRITE)
                waiter.select(max(0.0, deadline - time.monotonic()))


def _preload(modules: set[str]) -> None:
    """Import optional modules once here instead of once per rank (mlflow costs seconds)."""
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
