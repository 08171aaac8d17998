"""Turning a finished run's directory into return values or the root-cause exception."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from .errors import (
    CancelledError,
    DistributedError,
    DistributedTimeoutError,
    RankFailedError,
    RankFailure,
    RemoteError,
    RemoteTraceback,
    SerializationError,
    attach_remote_context,
)
from .events import RankFinished, RunFinished, RunStatus
from .protocol import ErrorRecord
from .rundirs import result_paths
from .serialization import load_from_file, load_result

R = TypeVar("R")


class RunResult(list[R], Generic[R]):
    """The ranks' return values in global-rank order: a plain ``list`` with run metadata.

    ``run_dir`` holds the per-rank logs (``logs/rank_N.txt``); ``links`` and ``metadata`` hold
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


def load_results(run_dir: Path, results_dir: Path | None, world_size: int) -> list[Any]:
    values = []
    for rank in range(world_size):
        paths = result_paths(run_dir, results_dir, rank)
        path = next((p for p in paths if p.exists()), paths[-1])
        try:
            values.append(load_result(path))
        except Exception as exc:  # e.g. the result's class cannot be imported in the caller
            raise SerializationError(
                f"the result of rank {rank} could not be loaded in the caller: "
                f"{type(exc).__name__}: {exc}",
                run_dir=run_dir,
            ) from exc
    return values


def failure_exception(
    finished: RunFinished,
    ranks: Mapping[int, RankFinished],
    stderr_tails: Mapping[int, str],
    run_dir: Path,
    timeout: float | None,
) -> BaseException:
    """The exception the caller raises for a run that did not succeed."""
    if finished.status is RunStatus.TIMED_OUT:
        return DistributedTimeoutError(timeout or 0.0, finished.unfinished_ranks, run_dir=run_dir)
    if finished.status is RunStatus.CANCELLED:
        return CancelledError(f"run cancelled: {finished.message}", run_dir=run_dir)
    root = finished.root_cause_rank
    if root is None:
        return DistributedError(f"run failed: {finished.message}", run_dir=run_dir)
    error_path = run_dir / f"error_{root}.pkl"
    if error_path.exists():
        return _exception_from_record(load_from_file(error_path), run_dir)
    info = ranks.get(root)
    failure = RankFailure(
        rank=root,
        time=info.time if info else finished.time,
        exit_code=info.exit_code if info else None,
        signal_name=info.signal_name if info else None,
        message=finished.message.removeprefix(f"rank {root} "),
        log_path=run_dir / "logs" / f"rank_{root}.txt",
        stderr_tail=stderr_tails.get(root, ""),
    )
    return RankFailedError(failure, run_dir=run_dir)


def _exception_from_record(record: ErrorRecord, run_dir: Path) -> BaseException:
    if record.exception is not None:
        try:
            exc = pickle.loads(record.exception)
        except Exception:  # a class the caller cannot import: fall back to the text record
            exc = None
        if isinstance(exc, BaseException):
            return attach_remote_context(exc, record.rank, record.traceback_text, run_dir)
    if record.library_error:
        err: DistributedError = SerializationError(record.message, run_dir=run_dir)
    else:
        err = RemoteError(
            record.rank, record.type_name, record.message, record.traceback_text, run_dir=run_dir
        )
    err.__cause__ = RemoteTraceback(record.rank, record.traceback_text)
    return err
