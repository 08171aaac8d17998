"""The launcher process: one per caller, started fresh, torch preloaded, never touches CUDA.

It forks one process per rank per call (legal and cheap: no CUDA context, no threads here),
supervises them (exit codes, timeouts, cancel, TERM -> KILL), tees their output to log files and
the event stream, and dies with its caller: EOF on the caller's socket ends it, and so does the
caller's exit seen through a pidfd, and the parent-death signal.

No peer can block it: every channel is non-blocking (``channel.py``). Only the end of the
caller's socket (or the caller's exit) means the caller is gone; any other error while
handling a message fails that message's run with its cause, and the launcher stays up.

Run as ``python -m serverless_gpu.launcher FD`` where FD is its end of a socketpair.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import psutil

from serverless_gpu.common.lifetime import (
    become_subreaper,
    die_with_parent,
    reap_adopted,
    terminate_groups,
)
from serverless_gpu.common.proctitle import set_title
from serverless_gpu.launcher.allocation import Allocator, devices_of
from serverless_gpu.launcher.log import log, log_exception
from serverless_gpu.launcher.rank_handle import RankProcess
from serverless_gpu.launcher.standby import RankSet, Standby, fork_set
from serverless_gpu.launcher.supervisor import RunSupervisor
from serverless_gpu.wire.channel import Channel, Undecodable
from serverless_gpu.wire.env import free_port, group_env
from serverless_gpu.wire.events import RunFinished, RunQueued, RunScheduled, RunStatus
from serverless_gpu.wire.protocol import (
    CancelRun,
    Exiting,
    Prewarm,
    RankGroups,
    RunAccepted,
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


class StartFailed(Exception):
    """A run could not be started; the message is what the caller reads."""


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
        self.runs: dict[str, RunSupervisor] = {}
        self.standby = Standby()
        self.preload: set[str] = set()
        self.allocator = Allocator()
        self.results_dirs: deque[Path] = deque(maxlen=256)
        """tmpfs folders of this caller's runs: deleted at shutdown in case the caller died
        before it could (the caller deletes each once it has loaded the results)."""
        self.running = True

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
            self._unhold()
            self.standby.reap()
            reap_adopted(self._known_pids())
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
        groups = tuple(sorted(self._known_pids()))
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
                    self.emit(
                        RunFinished(message.run_id, RunStatus.FAILED, None, text, (), time.time())
                    )

    def _handle(self, message: Any) -> None:
        if isinstance(message, Undecodable):
            log(f"a message from the caller could not be loaded: {message.error!r}")
        elif isinstance(message, RunSpec):
            self._start(message)
        elif isinstance(message, CancelRun):
            run = self.runs.get(message.run_id)
            if run is not None:
                run.cancel(message.reason, message.force)
            elif self.allocator.dequeue(message.run_id) is not None:
                self._end_queued(message.run_id, message.reason)
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

    def _start(self, spec: RunSpec) -> None:
        self.emit(RunAccepted(spec.run_id))
        self.standby.group_env = group_env(spec.env)
        shape = (spec.device, spec.world_size)
        self.standby.use(shape, spec.config.standby, spec.config.warm_process_group)
        if spec.paths.results_dir is not None:
            self.results_dirs.append(spec.paths.results_dir)
        admitted = self.allocator.admit(spec)
        if admitted is None:
            self.emit(RunQueued(spec.run_id, self.allocator.position(spec), time.time()))
            return
        self._launch(admitted)

    def _end_queued(self, run_id: str, reason: str) -> None:
        """A run that never left the queue ends as cancelled: it has no ranks to stop."""
        self.emit(RunFinished(run_id, RunStatus.CANCELLED, None, reason, (), time.time()))

    def _start_queued(self, ended_run_id: str) -> None:
        """Free the devices of a run that ended (or never started); start who can now."""
        for spec in self.allocator.release(ended_run_id):
            try:
                self._launch(spec)
            except Exception as exc:
                text = str(exc) if isinstance(exc, StartFailed) else repr(exc)
                log_exception(text)
                self.emit(RunFinished(spec.run_id, RunStatus.FAILED, None, text, (), time.time()))
                self.allocator.release(spec.run_id)  # the next run waits for a run's end

    def _launch(self, spec: RunSpec) -> None:
        """Start a run on the devices in its spec; they are freed if it cannot start."""
        try:
            self._launch_on_devices(spec)
        except BaseException:
            if spec.run_id not in self.runs:
                self.allocator.release(spec.run_id)
            raise

    def _launch_on_devices(self, spec: RunSpec) -> None:
        self.emit(RunScheduled(spec.run_id, devices_of(spec), time.time()))
        taken = {r.master_port for r in self.runs.values()}
        rank_set = self.standby.take(spec)
        if rank_set is None:
            rank_set = RankSet(self._fork_ranks(spec.world_size))
        self._report_groups()  # before any user code runs, so a rank's children are covered
        try:
            run = RunSupervisor(
                spec,
                rank_set.ranks,
                free_port(taken),
                self.emit,
                self.selector,
                grouped=rank_set.grouped,
            )
        except OSError as exc:
            self.standby.retire(rank_set)
            raise StartFailed(
                f"could not prepare the run's logs in {spec.paths.run_dir}: {exc.strerror or exc}"
            ) from exc
        except BaseException:
            self.standby.retire(rank_set)
            raise
        self.runs[spec.run_id] = run
        run.held = self._draining_on(spec)
        run.start()

    def _fork_ranks(self, count: int) -> list[RankProcess]:
        """``count`` new ranks for a call, or none: a failed fork kills the ones already made."""
        try:
            return fork_set(("cpu", count), "rank", None, cuda_context=False).ranks
        except OSError as exc:
            self.standby.reap_within(1.0)  # their places are needed by the next call
            raise StartFailed(
                f"could not start {count} ranks: fork failed: {exc}{_limits(exc)}"
            ) from exc

    def _draining_on(self, spec: RunSpec) -> bool:
        """Whether ranks of a finished run still exit on devices this call uses: its ranks
        wait until they are gone (their memory is freed then)."""
        devices = set(devices_of(spec))
        return any(
            run.finished
            and not run.all_exited
            and run.spec.device == spec.device
            and devices & set(devices_of(run.spec))
            for run in self.runs.values()
        )

    def _unhold(self) -> None:
        for run in self.runs.values():
            if run.held and not self._draining_on(run.spec):
                run.unhold()

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
            self._start_queued(run.spec.run_id)
        else:
            self.allocator.release(run.spec.run_id)
        self._refill_standby()

    def _close_run(self, run: RunSupervisor) -> None:
        if not run.devices_freed:
            self._free_devices(run)
        run.close()
        del self.runs[run.spec.run_id]
        if not self.runs:
            self._kill_adopted()
        self._refill_standby()

    # -- shutdown ------------------------------------------------------------------------------

    def _known_pids(self) -> set[int]:
        """Ranks (of runs and standby) not reaped yet; any other child is an adopted orphan."""
        pids = {pid for run in self.runs.values() for pid in run.unreaped_pids()}
        return pids | self.standby.pids()

    def _kill_adopted(self) -> None:
        """End what ranks left behind outside their process groups (a daemon that called
        setsid): with no call running, every child that is not a standby rank is a leftover."""
        known = self._known_pids()
        for child in psutil.Process().children():
            if child.pid not in known:
                with contextlib.suppress(psutil.Error, OSError):
                    if os.getpgid(child.pid) == child.pid:
                        os.killpg(child.pid, signal.SIGKILL)  # its session's members too
                    child.kill()
        reap_adopted(known)

    def _reap_all(self) -> None:
        """Reap every rank that has exited (its pid stays reserved until then), then the
        orphans it left to this subreaper (a killed rank's children)."""
        for run in self.runs.values():
            run.reap()
        self.standby.reap()
        reap_adopted(self._known_pids())

    def all_pids(self) -> list[int]:
        """Ranks not reaped yet: a reaped rank's pid (and group id) may belong to someone else."""
        pids = [pid for run in self.runs.values() for pid in run.unreaped_pids()]
        return pids + [r.pid for s in self.standby.sets.values() for r in s.ranks if r.alive()]

    def shutdown(self) -> None:
        self.running = False  # also stops runs that end now from preparing new standby ranks
        self.emit(Exiting())  # new calls go to a fresh launcher from now on
        for run in self.runs.values():
            run.cancel("the launcher is shutting down", force=True)
        while self.allocator.queue:
            self._end_queued(self.allocator.queue.popleft().run_id, "the launcher is shutting down")
        pids = self.all_pids()
        terminate_groups(pids, 1.0, reap=self._reap_all)
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
        self.standby = Standby()
        self._kill_adopted()
        self.backlog_selector.close()
        for folder in self.results_dirs:
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


def _limits(exc: OSError) -> str:
    """The limit a failed fork probably hit, in the user's words."""
    if exc.errno != errno.EAGAIN:
        return ""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return " (a process limit: a cgroup's pids.max or kernel.pid_max)"
    return f" (ulimit -u is {soft})"


def _preload(modules: set[str]) -> None:
    """Import optional modules once here instead of once per rank (mlflow costs seconds)."""
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass


def _watch_parent() -> int | None:
    """A pidfd of the caller (our parent), readable once it has exited: unlike the parent-death
    signal it does not depend on which of the caller's threads started us, and unlike EOF it
    does not wait for a child the caller forked (holding a copy of our socket) to exit."""
    parent = os.getppid()
    try:
        pidfd = os.pidfd_open(parent)
    except (OSError, AttributeError):  # an old kernel: EOF and the death signal remain
        return None
    if os.getppid() != parent:  # the caller died before the pidfd was opened
        os._exit(1)
    return pidfd


def main(argv: list[str]) -> int:
    fd = int(argv[1])
    set_title("launcher")
    if "--pdeathsig" in argv:
        # TERM, not KILL: the orderly shutdown below also deletes the runs' tmpfs results. The
        # ranks die with this process whatever happens (their own parent-death signal is KILL).
        die_with_parent(signal.SIGTERM)
    caller_pidfd = _watch_parent()
    become_subreaper()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides what an interrupt means
    started: list[LauncherLoop] = []

    def on_term(*_: object) -> None:
        # Once serving, end the loop rather than raise: the caller's death brings both EOF and
        # (through the parent-death signal) TERM, and an exception raised into the shutdown
        # that EOF started would cut it short. Before that there is nothing to clean up.
        if not started:
            raise SystemExit(0)
        started[0].running = False

    signal.signal(signal.SIGTERM, on_term)
    caller = Channel(socket.socket(fileno=fd))
    # Preload what every rank needs, so that a forked rank starts with it already imported.
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401

    from serverless_gpu.rank import runtime  # noqa: F401

    launcher = LauncherLoop(caller, caller_pidfd)
    started.append(launcher)
    try:
        launcher.serve()
    finally:
        launcher.shutdown()
    return 0
