"""Inside the launcher: admitting runs. A run's spec is accepted, waits in the queue while
other runs hold its devices, and starts on them with standby ranks or freshly forked ones; a
run that cannot start ends as failed with the cause, and its devices go to the next."""

from __future__ import annotations

import errno
import resource
import selectors
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serverless_gpu.launcher_process.allocation import Allocator, devices_of
from serverless_gpu.launcher_process.log import log_exception
from serverless_gpu.launcher_process.queue_wait import QueueClock, holders
from serverless_gpu.launcher_process.rank_handle import RankProcess
from serverless_gpu.launcher_process.standby import RankSet, Standby, fork_set
from serverless_gpu.launcher_process.supervisor import RunSupervisor
from serverless_gpu.wire.env import free_port, group_env
from serverless_gpu.wire.events import RunFinished, RunQueued, RunScheduled, RunStatus
from serverless_gpu.wire.protocol import RunAccepted
from serverless_gpu.wire.runspec import RunSpec


class StartFailed(Exception):
    """A run could not be started; the message is what the caller reads."""


class Admission:
    """The runs of one caller, from their spec to their start: the queue, the devices, the
    ranks. Their supervision (``runs``) is the loop's once they started."""

    def __init__(
        self,
        emit: Callable[[Any], None],
        selector: selectors.BaseSelector,
        report_groups: Callable[[], None],
    ) -> None:
        self.emit = emit
        self.selector = selector
        self.report_groups = report_groups
        """Tells the caller which rank groups exist: called before user code can run."""
        self.runs: dict[str, RunSupervisor] = {}
        self.standby = Standby()
        self.allocator = Allocator()
        self.clock = QueueClock()
        self.results_dirs: deque[Path] = deque(maxlen=256)
        """tmpfs folders of this caller's runs: deleted at shutdown in case the caller died
        before it could (the caller deletes each once it has loaded the results)."""

    def start(self, spec: RunSpec) -> None:
        """Accept a run: start it now if its devices are free, else queue it."""
        self.emit(RunAccepted(spec.run_id))
        self.standby.group_env = group_env(spec.env)
        shape = (spec.device, spec.world_size)
        self.standby.use(shape, spec.config.standby, spec.config.warm_process_group)
        if spec.paths.results_dir is not None:
            self.results_dirs.append(spec.paths.results_dir)
        admitted = self.allocator.admit(spec)
        if admitted is None:
            self.clock.queued(spec)
            held = holders(spec, (r.spec for r in self.runs.values()))
            self.emit(RunQueued(spec.run_id, self.allocator.position(spec), time.time(), held))
            return
        self._launch(admitted)

    def end_queued(self, run_id: str, reason: str) -> None:
        """A run that never left the queue ends as cancelled: it has no ranks to stop."""
        self.emit(RunFinished.stopped(run_id, RunStatus.CANCELLED, reason, (), time.time()))

    def cancel_queued(self, run_id: str, reason: str) -> bool:
        """Take a queued run out of the queue and end it; False if it is not queued."""
        if self.allocator.dequeue(run_id) is None:
            return False
        self.end_queued(run_id, reason)
        return True

    def end_all_queued(self, reason: str) -> None:
        while self.allocator.queue:
            self.end_queued(self.allocator.queue.popleft().run_id, reason)

    def expire_queued(self) -> None:
        """A queued run whose timeout passed while it waited ends, saying who holds what."""
        for spec in self.clock.overdue(self.allocator.queue):
            held = holders(spec, (r.spec for r in self.runs.values()))
            self.allocator.dequeue(spec.run_id)
            self.clock.since.pop(spec.run_id, None)
            reason = f"timed out after {spec.timeout:g} s waiting for devices: {held}"
            self.emit(
                RunFinished.stopped(spec.run_id, RunStatus.TIMED_OUT, reason, (), time.time())
            )

    def start_queued(self, ended_run_id: str) -> None:
        """Free the devices of a run that ended (or never started); start who can now."""
        for spec in self.allocator.release(ended_run_id):
            spec = self.clock.leaving(spec)
            try:
                self._launch(spec)
            except Exception as exc:
                text = str(exc) if isinstance(exc, StartFailed) else repr(exc)
                log_exception(text)
                self.emit(RunFinished.run_failed(spec.run_id, text, (), time.time()))
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
        self.report_groups()  # before any user code runs, so a rank's children are covered
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

    def unhold(self) -> None:
        """Let held runs start once the ranks they waited for have exited."""
        for run in self.runs.values():
            if run.held and not self._draining_on(run.spec):
                run.unhold()


def _limits(exc: OSError) -> str:
    """The limit a failed fork probably hit, in the user's words."""
    if exc.errno != errno.EAGAIN:
        return ""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return " (a process limit: a cgroup's pids.max or kernel.pid_max)"
    return f" (ulimit -u is {soft})"
