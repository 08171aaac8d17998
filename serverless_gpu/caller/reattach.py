"""``RunHandle.from_run_id(run_id)``: a handle on any run of the runs folder, from another kernel
or after ``serverless-gpu run --detach``.

A run of this process gives its own live handle. Any other run is read from its run directory,
whose ``run.json`` (``runrecord.py``) its caller keeps up to date: the status, the ranks' logs,
its links and, once it has ended, its outcome: the ranks' values while they wait unread in the
run directory (a run started with ``fn.start`` whose caller has not read them), ``None`` per
rank for a script run from the command line, or the root cause raised with its own type (from
the failed rank's error record). There are no events: nothing is dispatched, and subscribing
is refused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from serverless_gpu.caller import follow
from serverless_gpu.caller.handle import RunHandle, live_handle, register_reattach
from serverless_gpu.caller.results import RunResult, failure_exception, load_results
from serverless_gpu.caller.runrecord import LOST, RUNNING, RunInfo, read_record
from serverless_gpu.caller.waits import deadline_of, logs_first, read_log, still_running
from serverless_gpu.common.errors import (
    ConfigurationError,
    DistributedError,
    RankFailure,
    SerializationError,
    UsageError,
)
from serverless_gpu.doctor.stacks import WAIT_S, load_saved
from serverless_gpu.runfiles.rundirs import results_root
from serverless_gpu.wire.events import RunFinished, RunStatus, Subscriber
from serverless_gpu.wire.runpaths import RunPaths

_POLL_S = 0.2
"""How often a re-attached run's record is read while waiting for its end."""
_LOAD_TRIES = 3
"""A result may move from the tmpfs twin into the run directory while it is being read."""
_MAX_ID = 64
"""Run ids are 12 hex digits; a longer string names no run (and is not echoed whole)."""


def reattach(run_id: str) -> RunHandle[Any]:
    """The handle of the run ``run_id`` (or a unique prefix of it) in the runs folder."""
    from serverless_gpu.caller.runrecord import find_run, shown  # the one reader of run ids

    if not isinstance(run_id, str) or not run_id.strip():
        raise UsageError(f"from_run_id takes a run's id (a string), not {run_id!r:.80}")
    if len(run_id.strip()) > _MAX_ID:
        raise UsageError(
            f"from_run_id takes a run's id (12 hex digits, or a unique prefix, as "
            f"`serverless-gpu runs list` shows it), not {shown(run_id)}"
        )

    handle = live_handle(run_id.strip())
    if handle is not None:
        return handle
    info = find_run(run_id.strip())
    handle = live_handle(info.run_id)
    if handle is not None:
        return handle
    if not info.record:
        raise ConfigurationError(
            f"run {info.run_id} ({info.run_dir}) has no readable run.json: it was made by an "
            "older version or its record was damaged; its logs are in "
            f"{RunPaths(info.run_dir).logs}"
        )
    return RecordedRun(info)


def status_of(info: RunInfo) -> RunStatus:
    """A recorded run's status; a run lost with its caller is over, as ``failed``."""
    status = info.status
    if status == LOST:
        return RunStatus.FAILED
    if status == RUNNING:
        return RunStatus.RUNNING
    try:
        return RunStatus(status)
    except ValueError:
        from serverless_gpu.caller.runrecord import shown

        paths = RunPaths(info.run_dir)
        raise ConfigurationError(
            f"run {info.run_id}: its record {paths.record} has a status this version does not "
            f"know, {shown(status)} (the file was damaged, or written by another version), so "
            f"its outcome is unknown; its logs are in {paths.logs}"
        ) from None


class RecordedRun(RunHandle[Any]):
    """A run of another process, read from its run directory (see the module)."""

    def __init__(self, info: RunInfo) -> None:
        # No RunHandle.__init__: there is no context or event stream, only the run's files.
        self.run_id = info.run_id
        self.run_dir = info.run_dir
        self.ranks: dict[int, Any] = {}
        self.finished: RunFinished | None = None
        self._subscribers: list[Subscriber] = []

    def _info(self) -> RunInfo:
        return RunInfo(self.run_id, self.run_dir, read_record(self.run_dir))

    @property
    def status(self) -> RunStatus:
        """The run's status now, read from its record."""
        return status_of(self._info())

    @property
    def devices(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(str(d) for d in self._info().record.get("devices") or ())

    @property
    def links(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in dict(self._info().record.get("links") or {}).items()}

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.run_dir)

    def logs(self, rank: int = 0) -> str:
        return read_log(self.paths, rank)

    def subscribe(self, subscriber: Subscriber) -> None:
        raise UsageError(
            f"run {self.run_id} was re-attached from its run directory and sends no events; "
            "read its status, logs(rank) or result(logs=True) instead"
        )

    def poll(self, blocking: bool = True) -> bool:
        return self.status.finished

    def wait(self, timeout: float | None = None) -> bool:
        """Until the run's record shows its end (True), or ``timeout`` seconds (False)."""
        deadline = deadline_of(timeout)
        while not self.poll():
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True

    def cancel(self, reason: str = "cancelled by the user", *, force: bool = False) -> None:
        """Stop a run that ``serverless-gpu run`` started (as ``serverless-gpu runs cancel``);
        a run of another kernel is stopped there (its Cancel button, or interrupting it)."""
        from serverless_gpu.caller.runrecord import cancel

        cancel(self._info())

    def stacks(self, timeout: float = WAIT_S) -> dict[int, str]:
        """The stacks the run saved (a timeout saves them); live ones are its caller's."""
        return load_saved(self.paths, int(self._info().record.get("world_size") or 0))

    def result(self, timeout: float | None = None, logs: bool = False) -> RunResult[Any]:
        """Once the run has ended: its values, or its root cause raised (see the module)."""
        __tracebackhide__ = True
        timeout, logs = logs_first(timeout, logs)
        deadline = deadline_of(timeout)
        if logs:
            ended = follow.follow(lambda: self.paths, self.wait, deadline)
        else:
            ended = self.wait(timeout)
        if not ended:
            raise still_running(self.run_id, timeout, self.run_dir)
        return outcome(self._info())


def outcome(info: RunInfo) -> RunResult[Any]:
    """The values of a run that has ended, or its error raised."""
    status = status_of(info)
    if info.status == LOST:
        raise DistributedError(
            f"run {info.run_id} was lost with its caller (pid "
            f"{info.record.get('caller', {}).get('pid', '?')}): it ended without recording an "
            f"outcome (killed, or the machine restarted); its logs: {RunPaths(info.run_dir).logs}",
            run_dir=info.run_dir,
        )
    if status is not RunStatus.SUCCEEDED:
        raise _failure(info, status)
    record = info.record
    size = int(record.get("world_size") or 0)
    values = [None] * size if record.get("command") else _values(info, size)
    return RunResult(
        values,
        run_id=info.run_id,
        run_dir=info.run_dir,
        links=dict(record.get("links") or {}),
        metadata={"devices": tuple(record.get("devices") or ()), "reattached": True},
    )


def _failure(info: RunInfo, status: RunStatus) -> BaseException:
    """The exception the run's caller raised (or would raise) for it."""
    record = info.record
    root = record.get("root_cause_rank")
    message = str(record.get("message") or "")
    when = float(record.get("finished") or 0.0)
    if status is RunStatus.FAILED and isinstance(root, int):
        # The record keeps the root cause's words (``cause``), not its exit code or kind; a
        # record written before it had them has only the whole message, "rank N ...".
        cause = str(record.get("cause") or message.removeprefix(f"rank {root} "))
        failure = RankFailure(root, when, None, None, cause, detail=cause)
        finished = RunFinished.rank_failed(info.run_id, (failure,), (), when)
    elif status is RunStatus.FAILED:
        finished = RunFinished.run_failed(info.run_id, message, (), when)
    else:
        finished = RunFinished.stopped(info.run_id, status, message, (), when)
    # The record keeps no timeout: a timed-out run reads as the time it ran.
    return failure_exception(finished, {}, {}, RunPaths(info.run_dir), info.duration)


def _values(info: RunInfo, size: int) -> list[Any]:
    """The ranks' values, where they wait unread: the results twin or the run directory."""
    base = results_root()
    twin = None if base is None else base / info.run_dir.name
    paths = RunPaths(info.run_dir, twin if twin is not None and twin.is_dir() else None)
    missing = [r for r in range(size) if not any(p.exists() for p in paths.results(r))]
    if missing:
        raise DistributedError(_gone(info, twin, missing), run_dir=info.run_dir)
    for attempt in range(_LOAD_TRIES):
        try:
            return load_results(paths, size)
        except SerializationError as exc:  # moved from the twin as it was opened
            if attempt == _LOAD_TRIES - 1 or not isinstance(exc.__cause__, FileNotFoundError):
                raise
    raise AssertionError("unreachable")


def _gone(info: RunInfo, twin: Path | None, missing: list[int]) -> str:
    """Why a succeeded run's results are missing: read by its caller (its record says so), or
    deleted by something else (the values are lost)."""
    head = f"run {info.run_id} succeeded, and its results are no longer in {info.run_dir}"
    gone = info.record.get("results_gone")
    if gone == "read":
        return (
            f"{head}: its caller read them (a run's results are deleted once read); its "
            "handle there has them"
        )
    if gone == "dropped":
        return (
            f"{head}: its caller dropped its handle without reading them, and they went with "
            "it (keep the handle, or read the result, to keep them); the values are lost"
        )
    where = f" or {twin}" if twin is not None else ""
    ranks = ", ".join(str(r) for r in missing)
    return (
        f"{head}: the results of rank(s) {ranks} were deleted from {info.run_dir}{where} before "
        "its caller read them, by something other than serverless_gpu (a cleanup of the runs "
        "folder or of /dev/shm, or another process); the values are lost: run the function "
        f"again. Its logs: {RunPaths(info.run_dir).logs}"
    )


register_reattach(reattach)
