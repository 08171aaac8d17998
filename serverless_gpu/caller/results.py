"""Turning a finished run's directory into return values or the root-cause exception."""

from __future__ import annotations

import pickle
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from serverless_gpu.common.errors import (
    CONNECTION_LOST,
    RAISED,
    RESULT_NOT_WRITTEN,
    CancelledError,
    DistributedError,
    DistributedTimeoutError,
    RankFailedError,
    RankFailure,
    RemoteError,
    RemoteTraceback,
    SerializationError,
    StorageError,
    attach_remote_context,
    with_failures,
)
from serverless_gpu.doctor import flight, stack_text, stacks
from serverless_gpu.runfiles.serialization import load_from_file, load_result
from serverless_gpu.wire.events import RankFinished, RunFinished, RunStatus
from serverless_gpu.wire.protocol import ErrorRecord
from serverless_gpu.wire.runpaths import RunPaths

R = TypeVar("R")


class RunResult(list[R], Generic[R]):
    """The ranks' return values in global-rank order: a plain ``list`` with run metadata.

    ``run_dir`` holds the per-rank logs (in its ``logs`` folder); ``links`` and ``metadata`` hold
    what tracking added (``links["mlflow"]``, ``metadata["mlflow_run_id"]``).
    """

    def __init__(
        self,
        values: list[R],
        *,
        run_id: str,
        run_dir: Path,
        links: Mapping[str, str],
        metadata: Mapping[str, Any],
    ) -> None:
        super().__init__(values)
        self.run_id = run_id
        self.run_dir = run_dir
        self.links = dict(links)
        self.metadata = dict(metadata)


def load_results(paths: RunPaths, world_size: int) -> list[Any]:
    values = []
    run_dir = paths.run_dir
    for rank in range(world_size):
        places = paths.results(rank)
        path = next((p for p in places if p.exists()), places[-1])
        try:
            values.append(load_result(path))
        # BaseException: unpickling runs the result's own code, which may raise SystemExit or
        # KeyboardInterrupt; that is the rank's result misbehaving, not the caller exiting.
        except BaseException as exc:  # e.g. the result's class cannot be imported in the caller
            raise SerializationError.result_not_loaded(rank, exc, run_dir=run_dir) from exc
    return values


def failure_exception(
    finished: RunFinished,
    ranks: Mapping[int, RankFinished],
    stderr_tails: Mapping[int, str],
    paths: RunPaths,
    timeout: float | None,
    started: Collection[int] | None = None,
) -> BaseException:
    """The exception the caller raises for a run that did not succeed, with every rank's
    failure on it (:func:`errors.failures_of`). ``started``: the ranks that reached the
    function (None: not known, every unfinished rank reads as running)."""
    failures = tuple(_located(f, ranks, stderr_tails, paths) for f in finished.failures)
    if finished.status is RunStatus.TIMED_OUT and not ranks and finished.message:
        # no rank ever started: it timed out in the queue, and the launcher says who held what
        exc = DistributedTimeoutError(timeout or 0.0, (), run_dir=paths.run_dir)
        exc.args = (f"distributed call {finished.message}",)
        return exc
    if finished.status is RunStatus.TIMED_OUT:
        unfinished = finished.unfinished_ranks
        size = max([len(ranks), *(r + 1 for r in unfinished)])
        error = timeout_error(timeout or 0.0, unfinished, paths, size, started)
        return with_failures(error, failures)
    return with_failures(_run_exception(finished, failures, paths), failures)


def _run_exception(
    finished: RunFinished, failures: tuple[RankFailure, ...], paths: RunPaths
) -> BaseException:
    run_dir = paths.run_dir
    if finished.status is RunStatus.CANCELLED:
        return CancelledError(f"run cancelled: {finished.message}", run_dir=run_dir)
    if finished.root_cause is None:
        return DistributedError(f"run failed: {finished.message}", run_dir=run_dir)
    root = failures[0]
    error_path = paths.error(root.rank)
    if error_path.exists():
        return exception_from_record(load_from_file(error_path), root, run_dir)
    return RankFailedError(root, run_dir=run_dir)


def _located(
    failure: RankFailure,
    ranks: Mapping[int, RankFinished],
    stderr_tails: Mapping[int, str],
    paths: RunPaths,
) -> RankFailure:
    """A rank's failure as the caller knows it: with its process's exit, log and last lines."""
    info = ranks.get(failure.rank)
    return replace(
        failure,
        exit_code=info.exit_code if info else failure.exit_code,
        signal_name=info.signal_name if info else failure.signal_name,
        log_path=paths.log(failure.rank),
        stderr_tail=stderr_tails.get(failure.rank, ""),
    )


def timeout_error(
    timeout: float,
    unfinished: tuple[int, ...],
    paths: RunPaths,
    world_size: int,
    started: Collection[int] | None = None,
) -> DistributedTimeoutError:
    """With the stacks the launcher took before stopping the ranks, and where each was; an
    unfinished rank that never ``started`` the function is named as still starting."""
    running = tuple(r for r in unfinished if started is None or r in started)
    starting = tuple(r for r in unfinished if r not in running)
    found = stacks.load_saved(paths, world_size)
    where = {}
    for rank in range(world_size):
        collective = flight.last_collective(paths, rank)
        if rank in unfinished:  # running, or still starting: where its main thread was
            line = stack_text.where(found[rank]) if rank in found else "did not answer"
        elif collective or rank in found:
            line = "had returned (waiting for the others)"
        else:
            continue
        where[rank] = line + (f"; last collective: {collective}" if collective else "")
    return DistributedTimeoutError(
        timeout,
        running,
        starting=starting,
        run_dir=paths.run_dir,
        stacks=found,
        where=where,
        stacks_dir=paths.stacks_dir,
    )


def exception_from_record(
    record: ErrorRecord, failure: RankFailure, run_dir: Path
) -> BaseException:
    kind = record.kind
    if kind == CONNECTION_LOST:
        return RankFailedError(replace(failure, message=record.failure.message), run_dir=run_dir)
    exc = _unpickled(record.exception)
    # Only a real Exception keeps its type: a rank's KeyboardInterrupt (or another
    # BaseException) re-raised as is would read as the caller's own Ctrl-C or exit.
    if isinstance(exc, Exception):
        return attach_remote_context(exc, record.rank, record.traceback_text, run_dir)
    err: DistributedError
    text = record.failure.text
    if kind == RESULT_NOT_WRITTEN:
        err = StorageError(text, run_dir=run_dir)
    elif kind != RAISED:
        err = SerializationError(text, run_dir=run_dir)
    else:
        err = RemoteError(
            record.rank, record.type_name, record.message, record.traceback_text, run_dir=run_dir
        )
    err.rank = record.rank
    err.__cause__ = RemoteTraceback(record.rank, record.traceback_text)
    return err


def with_root_cause(finished: RunFinished, paths: RunPaths) -> RunFinished:
    """``finished`` worded from the root-cause rank's own record, when it wrote one: the
    launcher may know its failure only by its process's exit."""
    root = finished.root_cause
    if root is None or finished.status is not RunStatus.FAILED:
        return finished
    path = paths.error(root.rank)
    if not path.exists():
        return finished
    try:
        record = load_from_file(path)
    except Exception:  # result() reports a broken record; the event stays as is
        return finished
    reported = replace(
        record.failure, time=root.time, exit_code=root.exit_code, signal_name=root.signal_name
    )
    failures = (reported, *finished.failures[1:])
    return replace(finished, message=reported.text, failures=failures)


def _unpickled(data: bytes | None) -> BaseException | None:
    if data is None:
        return None
    try:
        exc = pickle.loads(data)
    except BaseException:  # a class the caller cannot import (or one that exits on load)
        return None
    return exc if isinstance(exc, BaseException) else None
