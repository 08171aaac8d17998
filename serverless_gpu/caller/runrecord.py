"""``run.json`` in every run directory: what a run was, for ``serverless-gpu runs``.

Written by a run hook in the caller when the call starts (name, ranks, device, start time, the
caller's pid, the MLflow run) and again when it ends (status, end time, root cause). A run whose
record still says ``running`` but whose caller is gone was lost with its caller (killed, or the
machine restarted). Nothing else is stored anywhere: listing runs reads the run directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from serverless_gpu.caller.hooks import RunContext, register_hook
from serverless_gpu.common.errors import ConfigurationError
from serverless_gpu.runfiles.rundirs import runs_root
from serverless_gpu.wire.events import Event, RunFinished, RunScheduled, RunStatus
from serverless_gpu.wire.runpaths import MARKER, RUN_NAME, RunPaths

RUNNING = "running"
LOST = "lost"
"""The caller ended without recording an outcome."""
UNKNOWN = "unknown"
"""A run directory without a record (made by an older version)."""
_CLOCK_SLACK_S = 1.0
_HOOK_ORDER = 50
_CANCEL_WAIT_S = 30.0
"""After tracking (10), so that the MLflow run's link is known."""


def record_hook(ctx: RunContext) -> RunRecorder:
    me = psutil.Process()
    placement = ctx.placement
    record = {
        "run_id": ctx.run_id,
        "name": ctx.name,
        "world_size": placement.world_size,
        "device": placement.device,
        "gpu_type": placement.gpu_type.value,
        "started": time.time(),
        "finished": None,
        "status": RUNNING,
        "message": "",
        "caller": {"pid": me.pid, "create_time": me.create_time()},
        "links": dict(ctx.links),
        # A sweep trial's params, else the call's arguments (the original records them).
        "params": dict(ctx.metadata.get("params") or ctx.metadata.get("call_params") or {}),
        "mlflow": {
            key[len("mlflow_") :]: value
            for key, value in ctx.metadata.items()
            if key.startswith("mlflow_")
        },
    }
    recorder = RunRecorder(ctx.run_dir)
    recorder.update(record)
    return recorder


class RunRecorder:
    """The record's subscriber: writes the outcome when the run ends."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def update(self, fields: dict[str, Any]) -> None:
        update_record(self.run_dir, fields)

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunScheduled):  # the devices the launcher allocated to the run
            self.update({"devices": list(event.devices)})
        elif isinstance(event, RunFinished):
            self.update(
                {
                    "status": event.status.value,
                    "finished": event.time,
                    "message": event.message,
                    "root_cause_rank": event.root_cause_rank,
                    "cause": event.cause,
                }
            )


def update_record(run_dir: Path, fields: dict[str, Any]) -> None:
    """Merge ``fields`` into the run's record (written whole, then renamed: never half-read).
    A record that cannot be written costs the listing its entry, never the run."""
    path = RunPaths(run_dir).record
    with contextlib.suppress(OSError):
        record = {**read_record(run_dir), **fields}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp, path)


def read_record(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads(RunPaths(run_dir).record.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class RunInfo:
    """One run as ``serverless-gpu runs`` shows it."""

    run_id: str
    run_dir: Path
    record: dict[str, Any]

    @property
    def status(self) -> str:
        status = str(self.record.get("status", UNKNOWN))
        with contextlib.suppress(ValueError):
            status = RunStatus(status).value  # an older record's word for it reads as today's
        if status == RUNNING and not self.caller_alive():
            return LOST
        return status

    @property
    def name(self) -> str:
        return str(self.record.get("run_name") or self.record.get("name") or "")

    @property
    def started(self) -> float:
        started = self.record.get("started")
        if isinstance(started, (int, float)):
            return float(started)
        try:
            return (self.run_dir / MARKER).stat().st_mtime
        except OSError:
            return 0.0

    @property
    def duration(self) -> float | None:
        finished = self.record.get("finished")
        if isinstance(finished, (int, float)):
            return float(finished) - self.started
        if self.status == RUNNING:
            return time.time() - self.started
        return None

    @property
    def mlflow_link(self) -> str:
        return str(self.record.get("links", {}).get("mlflow", ""))

    def caller_alive(self) -> bool:
        """Whether the process that started the run (its pid, started when it was) runs."""
        caller = self.record.get("caller", {})
        try:
            proc = psutil.Process(int(caller["pid"]))
            return abs(proc.create_time() - float(caller["create_time"])) < _CLOCK_SLACK_S
        except (KeyError, TypeError, ValueError, psutil.Error):
            return False

    def log_path(self, rank: int) -> Path:
        return RunPaths(self.run_dir).log(rank)

    def log_paths(self) -> dict[int, Path]:
        return RunPaths(self.run_dir).existing_logs()


def list_runs(root: Path | None = None) -> list[RunInfo]:
    """Every run directory of this user under the runs root, newest first."""
    root = runs_root() if root is None else root
    runs = []
    with os.scandir(root) as entries:
        for entry in entries:
            run_dir = Path(entry.path)
            if not (
                RUN_NAME.fullmatch(entry.name)
                and entry.is_dir(follow_symlinks=False)
                and (run_dir / MARKER).is_file()
            ):
                continue
            record = read_record(run_dir)
            run_id = str(record.get("run_id") or entry.name.rsplit("-", 1)[-1])
            runs.append(RunInfo(run_id, run_dir, record))
    runs.sort(key=lambda run: run.started, reverse=True)
    return runs


register_hook(record_hook, order=_HOOK_ORDER)


def shown(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut to ``limit`` characters with its length said: a message never echoes
    a huge argument whole."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def note_results_gone(run_dir: Path, because: str) -> None:
    """The caller deletes the run's results now, ``because`` it read them (``"read"``) or its
    handle was dropped unread (``"dropped"``): a reader of the record in another process can
    tell that from results deleted by something else."""
    if read_record(run_dir):
        update_record(run_dir, {"results_gone": because})


def find_run(run_id: str) -> RunInfo:
    """The run whose id is ``run_id`` or starts with it (a unique prefix is enough)."""
    matches = [run for run in list_runs() if run.run_id.startswith(run_id)]
    exact = [run for run in matches if run.run_id == run_id]
    if exact:
        return exact[0]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConfigurationError(
            f"no run {shown(run_id)} (serverless-gpu runs list shows the runs)"
        )
    raise ConfigurationError(
        f"{shown(run_id)} names {len(matches)} runs: {', '.join(r.run_id for r in matches)}"
    )


def cancel(run: RunInfo) -> str:
    """Stop a run started from the command line; returns its final status."""
    if run.status != RUNNING:
        return run.status
    pid = run.record.get("cli_pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise ConfigurationError(
            f"run {run.run_id} was not started by `serverless-gpu run`: cancel it where it "
            "runs (the notebook's Cancel button, or interrupt the kernel)"
        )
    caller = psutil.Process(int(pid))
    with contextlib.suppress(ProcessLookupError):
        os.kill(caller.pid, signal.SIGTERM)
    deadline = time.monotonic() + _CANCEL_WAIT_S
    while not _ended(caller) and time.monotonic() < deadline:
        time.sleep(0.05)
    return RunInfo(run.run_id, run.run_dir, read_record(run.run_dir)).status


def _ended(proc: psutil.Process) -> bool:
    """Exited, or exited and not reaped yet by its parent (a zombie: ``psutil``'s ``wait`` of
    a process that is not our child would wait for the reaping, whenever that comes)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
