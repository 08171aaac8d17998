"""One call's tracking in the caller: opens the MLflow run, turns events into writes, ends it.

The run's outcome maps to MLflow's statuses: succeeded -> FINISHED; failed or timed out ->
FAILED, with the root cause as a tag; cancelled or interrupted -> KILLED.

The run is opened before the ranks start (their MLflow environment names it); what comes after
(metrics still queued, the ranks' logs, the closing tags, the status) is written behind: the
call returns with its results while its writer thread ends the run. :func:`wait_written` waits
for that, and so does the process's exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from functools import partial

import mlflow
from mlflow import MlflowClient

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.tracking import private, records, store
from serverless_gpu.tracking.deadline import call_with_deadline
from serverless_gpu.tracking.errors import TrackingUnavailableError, TrackingWarning
from serverless_gpu.tracking.experiment import mark_training_experiment
from serverless_gpu.tracking.outcome import mlflow_status, outcome_tags
from serverless_gpu.tracking.reaper import end_orphaned_runs
from serverless_gpu.tracking.run_setup import MlflowRun, mlflow_env, open_run
from serverless_gpu.tracking.settings import MESSAGE_KIND, RANK_INITIALIZER
from serverless_gpu.tracking.spill import Spill
from serverless_gpu.tracking.writer import Writer
from serverless_gpu.wire.events import (
    Event,
    EventSubscriber,
    RankMessage,
    RunFinished,
    RunStarted,
    SystemMetrics,
)

_open: set[RunTracker] = set()
"""Trackers whose run has not ended; ended as KILLED if the caller exits first."""
_behind: list[RunTracker] = []
"""Trackers of ended runs whose writer may still be writing (or has something to say)."""
_open_lock = threading.Lock()
_marked: set[tuple[str, str]] = set()
"""(store, experiment) pairs this process has marked as training experiments."""


def wait_written(timeout: float | None = None) -> bool:
    """Wait until the MLflow runs of this process's ended calls are complete in their store.

    A call returns once its results are back; the end of its run (the last metrics, the ranks'
    logs, the closing tags and the status) is written behind it, within milliseconds on a
    local store. A script that reads the run right after the call waits here first; the
    process's exit waits as well. A store problem met meanwhile is warned about here (or at the
    next call, or at exit). False if ``timeout`` ran out first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _open_lock:
        trackers = list(_behind)
    for tracker in trackers:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not tracker.see_written(left):
            return False
    return True


CELL_WAIT_S = 10.0
"""In IPython, how long a cell waits before it runs for the runs written behind the cells
before it (a notebook's next cell reads what the previous call logged)."""
_cells_hooked: list[bool] = []


def _hook_cells() -> None:
    """Once per process, in IPython: every cell starts once the ended runs are written, so that
    "Run all" reading a run right after its call finds it complete."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or _cells_hooked:
        return
    _cells_hooked.append(True)
    shell.events.register("pre_run_cell", _before_cell)


def _before_cell(info: object = None) -> None:
    wait_written(CELL_WAIT_S)


def _see_written_ones() -> None:
    """Say what the runs written behind since the last call met, without waiting."""
    with _open_lock:
        trackers = [t for t in _behind if t.writer is None or t.writer.done]
    for tracker in trackers:
        tracker.see_written(0)


def start_tracking(ctx: RunContext) -> RunTracker:
    """Open the call's MLflow run and prepare the ranks; never raises for a store problem."""
    _see_written_ones()
    _hook_cells()
    uri = store_uri()
    spill = Spill(ctx.paths.unsent)
    ctx.rank_initializers.append(RANK_INITIALIZER)
    try:
        if not store.reachable(uri):
            raise TrackingUnavailableError(f"the tracking server {uri} does not answer")
        with _quiet_store_setup():  # MlflowClient creates a new store
            with private.OPENING:  # not while the warm-up opens it (hook.prepare_ahead)
                private.create_private_store(uri)
                client = MlflowClient(uri)
            run = _open_bounded(ctx, client, uri, records.run_tags(ctx))
    except Exception as exc:  # whatever the store raised, the training must still run
        # Ranks keep logging fast, into the run directory instead of a store that hangs them.
        ctx.env[settings.MLFLOW_RUN_ID.name] = ""
        tracker = RunTracker(ctx, uri, None, None, spill)
        tracker.warn_untracked(exc, started=False)
        return tracker
    ctx.env.update(mlflow_env(run))
    ctx.metadata.update(
        mlflow_run_id=run.mlflow_run_id,
        mlflow_experiment_id=run.experiment_id,
        mlflow_tracking_uri=uri,
    )
    link = store.run_link(uri, run.experiment_id, run.mlflow_run_id)
    if link is not None:
        ctx.links["mlflow"] = link
        ctx.metadata["mlflow_run_url"] = link
    upload_every = settings.MLFLOW_LOG_UPLOAD_INTERVAL.read()
    writer = Writer(client, run.mlflow_run_id, ctx.paths.logs, spill, upload_every, run.params)
    writer.private_artifacts = private.local_path(run.artifact_uri)
    # A new run has its tags from create_run; a resumed one gets them here.
    writer.setup(records.run_params(ctx), records.run_tags(ctx) if run.resumed else {})
    _housekeeping(writer, client, uri, run.experiment_id)
    return RunTracker(ctx, uri, run, writer, spill)


def _housekeeping(writer: Writer, client: MlflowClient, uri: str, experiment_id: str) -> None:
    """After the run's end (off the call's path): mark the experiment as one of training (once
    per store and experiment in a process) and end other callers' orphaned runs."""
    with _open_lock:
        first = (uri, experiment_id) not in _marked
        _marked.add((uri, experiment_id))
    if first:
        writer.after_end(partial(mark_training_experiment, client, experiment_id))
    writer.after_end(partial(end_orphaned_runs, client))


def _open_bounded(
    ctx: RunContext, client: MlflowClient, uri: str, tags: dict[str, str]
) -> MlflowRun:
    """``open_run``, within a deadline for a server (one that answers its health check but not
    the API would otherwise hold the call for MLflow's minutes of retries)."""
    parent = mlflow.active_run()
    resume_id = os.environ.get("MLFLOW_RUN_ID")
    if resume_id:
        _wait_written_run(resume_id)  # an earlier call's end of that run must not come after
    if not store.is_http(uri):
        return open_run(ctx, client, uri, parent, tags)
    timeout = settings.MLFLOW_START_TIMEOUT.read()
    return call_with_deadline(
        partial(open_run, ctx, client, uri, parent, tags),
        timeout,
        f"the tracking server {uri}",
        on_late=partial(_end_late_run, client),
    )


@contextlib.contextmanager
def _quiet_store_setup() -> Iterator[None]:
    """MLflow logs "Creating initial MLflow database tables..." at INFO when the first call
    creates a store; it is not news for the user of a tracked call."""
    logger = logging.getLogger("mlflow.store.db.utils")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _wait_written_run(run_id: str) -> None:
    with _open_lock:
        trackers = [t for t in _behind if t.run is not None and t.run.mlflow_run_id == run_id]
    for tracker in trackers:
        tracker.see_written()


def _end_late_run(client: MlflowClient, run: MlflowRun) -> None:
    """The run was created after the call had given up on it: nobody will write to it."""
    client.set_tag(run.mlflow_run_id, records.ERROR_TAG, "the tracking server answered too late")
    client.set_terminated(run.mlflow_run_id, "KILLED")


def store_uri() -> str:
    return mlflow.get_tracking_uri()


class RunTracker(EventSubscriber):
    """The subscriber of one tracked call."""

    def __init__(
        self,
        ctx: RunContext,
        uri: str,
        run: MlflowRun | None,
        writer: Writer | None,
        spill: Spill,
    ) -> None:
        self.ctx = ctx
        self.uri = uri
        self.run = run
        self.writer = writer
        self.spill = spill
        self.finished = False
        self._warned = False
        with _open_lock:
            _open.add(self)

    def __call__(self, event: Event) -> None:
        super().__call__(event)
        if self.writer is not None and self.writer.failure is not None:
            self.warn_untracked(self.writer.failure, started=True)

    def on_rank_message(self, event: RankMessage) -> None:
        if event.kind == MESSAGE_KIND:
            if self.writer is not None:
                self.writer.batch(event.rank, event.time, event.data)
            else:
                self.spill.write("batch", event.rank, event.time, event.data)
        elif event.cell_ended is not None and event.rank == 0:
            self._keep_cell(event.cell_ended)

    def on_system_metrics(self, event: SystemMetrics) -> None:
        if self.writer is not None:
            self.writer.system(event.time, event.values)

    def on_run_started(self, event: RunStarted) -> None:
        self._announce()

    def on_run_finished(self, event: RunFinished) -> None:
        self._finish(mlflow_status(event), outcome_tags(event, self.ctx.paths))

    def _keep_cell(self, number: int) -> None:
        """A session cell's code as the run's artifact ``cells/0003.py`` (pull and push cells
        have none)."""
        path = self.ctx.run_dir / "cells" / f"{number:04d}.py"
        writer = self.writer
        if writer is not None and path.exists():
            writer.run_later(partial(writer.client.log_artifact, writer.run_id, str(path), "cells"))

    def abandon(self) -> None:
        """The caller exits before the run finished: mark it KILLED."""
        self._finish("KILLED", {records.ERROR_TAG: records.CALLER_EXITED})

    def _finish(self, status: str, tags: dict[str, str]) -> None:
        # The run's end may be recorded by the finisher thread while the exit handler
        # abandons what is left: whichever comes first is the run's status.
        with _open_lock:
            if self.finished:
                return
            self.finished = True
            _open.discard(self)
            if self.writer is not None:
                _behind.append(self)
        if self.writer is not None:
            self.writer.finish(status, tags)  # written behind: see wait_written

    def see_written(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the ended run's writes, then warn of what went wrong
        (once). False if the writes go on."""
        writer = self.writer
        if writer is not None:
            # An HTTP store that went away would hold the caller for minutes of MLflow's retries.
            reachable = partial(store.reachable, self.uri) if store.is_http(self.uri) else None
            if not writer.wait(reachable, timeout):
                return False
        with _open_lock:
            if self not in _behind:
                return True  # settled by another thread
            _behind.remove(self)
        if writer is None:
            return True
        if writer.failure is not None:
            self.warn_untracked(writer.failure, started=True)
        elif writer.conflicts:
            warnings.warn(
                f"serverless_gpu: MLflow keeps the first value of a param; ignored: "
                f"{'; '.join(writer.conflicts[:5])}",
                TrackingWarning,
                stacklevel=3,
            )
        return True

    def _announce(self) -> None:
        if self.run is None or self.ctx.display_claimed:
            return
        where = store.open_hint(self.run.uri, self.run.experiment_id, self.run.mlflow_run_id)
        print(f"serverless_gpu: MLflow {where}", file=sys.stdout, flush=True)

    def warn_untracked(self, reason: BaseException, *, started: bool) -> None:
        """The one warning of a run whose tracking could not start or had to stop."""
        if self._warned:
            return
        self._warned = True
        self.spill.touch()  # the warning names the file: it exists, empty if nothing was lost
        what = "tracking stopped" if started else "not tracked"
        warnings.warn(
            f"serverless_gpu: {self.ctx.name} {what} in MLflow ({self.uri}: "
            f"{type(reason).__name__}: {reason}). The run itself goes on; its logs are in "
            f"{self.ctx.paths.logs}, metrics not written to MLflow in {self.spill.path}.",
            TrackingWarning,
            stacklevel=3,
        )


@atexit.register
def _end_abandoned_runs() -> None:
    """At the caller's exit: runs still going end as KILLED, and every run's end is written
    before the process goes (a script that exits right after its call loses nothing)."""
    with _open_lock:
        trackers = list(_open)
    for tracker in trackers:
        tracker.abandon()
    wait_written()
