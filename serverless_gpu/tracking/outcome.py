"""How a run's end is recorded: MLflow's status, our status tag, and for a run that did not
succeed the root cause (tag) and a description with the failing rank's traceback or last lines.

The description is MLflow's ``mlflow.note.content`` tag, the first text of the run's page; a tag
value is cut short by MLflow, the description keeps the whole traceback.
"""

from __future__ import annotations

from pathlib import Path

from serverless_gpu.runfiles.serialization import load_from_file
from serverless_gpu.tracking import records
from serverless_gpu.wire.events import RunFinished, RunStatus
from serverless_gpu.wire.runpaths import RunPaths

MLFLOW_STATUS = {
    RunStatus.SUCCEEDED: "FINISHED",
    RunStatus.FAILED: "FAILED",
    RunStatus.TIMED_OUT: "FAILED",
    RunStatus.CANCELLED: "KILLED",
}
DESCRIPTION_TAG = "mlflow.note.content"
_LOG_TAIL_LINES = 30
_MAX_DESCRIPTION = 20000


def mlflow_status(event: RunFinished) -> str:
    return MLFLOW_STATUS.get(event.status, "FAILED")


def outcome_tags(event: RunFinished, paths: RunPaths) -> dict[str, str]:
    tags = {records.STATUS_TAG: event.status.value}
    if event.status is RunStatus.SUCCEEDED:
        return tags
    # The launcher's root cause: "rank 1 raised ValueError: ...", "rank 0 was killed by
    # SIGKILL", "exceeded its timeout ...", or the reason given to cancel.
    cause = event.message or event.status.value
    tags[records.ERROR_TAG] = cause
    tags[DESCRIPTION_TAG] = description(cause, event.root_cause_rank, paths)
    return tags


def description(cause: str, rank: int | None, paths: RunPaths) -> str:
    parts = [cause]
    if rank is not None:
        log = paths.log(rank)
        detail = _traceback(paths.error(rank)) or _tail(log)
        if detail:
            parts.append(f"```\n{detail.rstrip()}\n```")
        parts.append(f"Rank {rank}'s full output: `{log}` (artifact `logs/{log.name}`).")
    text = "\n\n".join(parts)
    return text if len(text) <= _MAX_DESCRIPTION else "…" + text[-_MAX_DESCRIPTION:]


def _traceback(path: Path) -> str:
    """The traceback the failing rank recorded with its exception, if it wrote one."""
    try:
        record = load_from_file(path)
    except Exception:  # no record (a crash), or one this process cannot read
        return ""
    return str(getattr(record, "traceback_text", "") or "")


def _tail(log: Path) -> str:
    """The last lines a rank wrote (a crash leaves no traceback)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])
