"""``serverless-gpu runs``: list, show, follow and cancel runs, from the run directories (their
``run.json`` records and per-rank logs) and the MLflow store each run was tracked in."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from serverless_gpu.caller.follow import LogTail
from serverless_gpu.caller.runrecord import (
    RUNNING,
    RunInfo,
    list_runs,
    read_record,
)
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.wire.runpaths import RunPaths

_FOLLOW_POLL_S = 0.2


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _gpus(run: RunInfo) -> str:
    size = run.record.get("world_size")
    if size is None:
        return "-"
    kind = run.record.get("gpu_type") or run.record.get("device") or ""
    return f"{size} x {kind}".strip()


UNREADABLE = "unreadable"
"""The status shown for a run whose ``run.json`` is damaged: the other runs are still listed."""
_DAMAGED = (TypeError, ValueError, AttributeError, OverflowError, KeyError)
"""What reading a damaged record's fields raises (a number that is text, a date past 9999 ...)."""


def _row(run: RunInfo) -> tuple[str, ...]:
    if _damage(run) is not None:
        return (run.run_id, run.run_dir.name[:30], UNREADABLE, "-", "-", "-", "-")
    return _fields(run)


def _fields(run: RunInfo) -> tuple[str, ...]:
    return (
        run.run_id,
        run.name[:30],
        run.status,
        _gpus(run),
        _when(run.started),
        _duration(run.duration),
        run.mlflow_link or "-",
    )


def _damage(run: RunInfo) -> str | None:
    """Why the run's record cannot be shown, or None when it can (or there is none: a run
    directory of an older version)."""
    if not run.record:
        path = RunPaths(run.run_dir).record
        return f"{path} is not a JSON object" if path.exists() else None
    try:
        if not isinstance(run.record.get("status", ""), str):
            raise TypeError("its status is not a word")
        _fields(run)
        _when(run.record.get("finished") or 0)  # a time past the year 9999 is no time
    except _DAMAGED as exc:
        return f"{RunPaths(run.run_dir).record}: {exc}"
    return None


def list_table(limit: int) -> list[str]:
    header = ("ID", "NAME", "STATUS", "GPUS", "START", "DURATION", "MLFLOW")
    rows = [_row(run) for run in list_runs()[:limit]]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False))
        + "  "
        + str(row[-1])
        for row in [header, *rows]
    ]


def show_lines(run: RunInfo) -> list[str]:
    damage = _damage(run)
    if damage is not None:
        return [
            f"id:        {run.run_id}",
            f"status:    {UNREADABLE} (its record {damage})",
            f"run dir:   {run.run_dir}",
            *(f"log:       rank {rank}: {path}" for rank, path in run.log_paths().items()),
        ]
    rec = run.record
    lines = [
        f"id:        {run.run_id}",
        f"name:      {run.name}",
        f"status:    {run.status}",
        f"ranks:     {_gpus(run)}",
        f"started:   {_when(run.started)}",
        f"duration:  {_duration(run.duration)}",
    ]
    if rec.get("command"):
        lines.append(f"command:   {rec['command']}")
    if rec.get("message"):
        lines.append(f"cause:     {rec['message']}")
    lines.append(f"run dir:   {run.run_dir}")
    for rank, path in run.log_paths().items():
        lines.append(f"log:       rank {rank}: {path}")
    if run.mlflow_link:
        lines.append(f"mlflow:    {run.mlflow_link}")
    lines.extend(_mlflow_lines(rec.get("mlflow", {})))
    return lines


def _mlflow_lines(mlflow_info: dict[str, Any]) -> list[str]:
    """The MLflow run's status and latest metrics, read from its store."""
    uri, run_id = mlflow_info.get("tracking_uri"), mlflow_info.get("run_id")
    if not uri or not run_id:
        return []
    try:
        from mlflow import MlflowClient

        from serverless_gpu.tracking.store import reachable

        if not reachable(uri):
            return [f"mlflow:    the tracking server {uri} does not answer"]
        run = MlflowClient(uri).get_run(run_id)
    except Exception as exc:  # a missing mlflow or a moved store: the rest is still shown
        return [f"mlflow:    not read ({type(exc).__name__}: {str(exc)[:200]})"]
    lines = [f"mlflow run: {run_id} ({run.info.status}) in {uri}"]
    for key, value in sorted(run.data.metrics.items()):
        lines.append(f"  {key} = {value:g}")
    return lines


def print_logs(run: RunInfo, rank: int | None, follow: bool) -> int:
    paths = run.log_paths()
    if rank is not None:
        size = run.record.get("world_size")
        known = rank in paths or (follow and isinstance(size, int) and rank < size)
        if not known:  # a rank that has not started yet is waited for when following
            raise ConfigurationError(f"run {run.run_id} has no log for rank {rank}")
        paths = {rank: run.log_path(rank)}
    tail = LogTail(prefix=rank is None and len(paths) > 1)
    try:
        while True:
            running = follow and _running(run)
            tail.emit(paths)
            if not running:
                break
            time.sleep(_FOLLOW_POLL_S)
            if rank is None:  # ranks that started after following began
                paths = run.log_paths()
    except KeyboardInterrupt:
        return 130
    tail.flush(paths)  # a last line without its newline
    return 0


def _running(run: RunInfo) -> bool:
    return RunInfo(run.run_id, run.run_dir, read_record(run.run_dir)).status == RUNNING
