"""A job file of air's format run detached (``serverless-gpu run job.yaml --detach``): the
detached process gives the job a run directory, as a decorated call has, so that
``serverless-gpu runs list | show | logs --follow | cancel`` follow and stop it.

The command runs once for the node, so the node's output (the command's, ``torchrun``'s and
every rank it starts) is one log, ``logs/rank_0.txt``; the record says how the job ended."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import psutil

from serverless_gpu.caller.runrecord import update_record
from serverless_gpu.cli.airjob import AirCodeSource, AirJob, AirSnapshot
from serverless_gpu.cli.airrun import run_air_job
from serverless_gpu.cli.launch import EXIT_INTERRUPTED, EXIT_TIMED_OUT
from serverless_gpu.common.gpus import GPUType, cpu_mode_requested
from serverless_gpu.runfiles.rundirs import new_run_dir, release_run
from serverless_gpu.wire.accelerators import node_shape
from serverless_gpu.wire.events import RunStatus
from serverless_gpu.wire.runpaths import RunPaths

_ENDED = {0: RunStatus.SUCCEEDED, EXIT_TIMED_OUT: RunStatus.TIMED_OUT}
_ENDED[EXIT_INTERRUPTED] = RunStatus.CANCELLED


def placed(job: AirJob, job_dir: Path) -> AirJob:
    """The job with its code folder as an absolute path: the detached process does not know
    the job file's folder."""
    code = job.code_source_path(job_dir)
    if code is None or job.code_source is None:
        return job
    snapshot = job.code_source.snapshot.model_copy(update={"root_path": str(code)})
    source = AirCodeSource(type="snapshot", snapshot=AirSnapshot.model_validate(snapshot))
    return job.model_copy(update={"code_source": source})


def run_recorded(job: AirJob, announce_fd: int) -> int:
    """Run the job with a run directory of its own (its id announced on ``announce_fd``, the
    process's output moved to its log); the exit status, as :func:`run_air_job`'s."""
    ranks = job.compute.ranks()  # a request this machine cannot run leaves no run behind
    name = job.mlflow_run_name or job.experiment_name or "air-job"
    run_id, run_dir, results = new_run_dir(name)
    if results is not None:
        shutil.rmtree(results, ignore_errors=True)  # the command's ranks return no values here
    paths = RunPaths(run_dir)
    paths.logs.mkdir(exist_ok=True)
    me = psutil.Process()
    update_record(run_dir, _started(job, run_id, name, ranks, me))
    _announce(announce_fd, run_id, paths.log(0))
    code = EXIT_INTERRUPTED
    try:
        code = run_air_job(job, Path(os.getcwd()))
    finally:
        status = _ENDED.get(code, RunStatus.FAILED)
        update_record(
            run_dir, {"status": status.value, "finished": time.time(), "message": _said(code)}
        )
        release_run(run_dir)
    return code


def _started(job: AirJob, run_id: str, name: str, ranks: int, me: psutil.Process) -> dict[str, Any]:
    """The record's first fields, as a decorated call's record has them."""
    family = node_shape(job.compute.accelerator_type)[1]
    cpu = cpu_mode_requested(family)
    return {
        "device": "cpu" if cpu else "cuda",
        "gpu_type": GPUType.CPU.value if cpu else family.value,
        "run_id": run_id,
        "name": name,
        "run_name": name,
        "world_size": ranks,
        "started": time.time(),
        "finished": None,
        "status": RunStatus.RUNNING.value,
        "message": "",
        "caller": {"pid": me.pid, "create_time": me.create_time()},
        "cli_pid": me.pid,
        "detached": True,
        "command": job.command,
        "params": {str(k): str(v) for k, v in (job.parameters or {}).items()},
    }


def _said(code: int) -> str:
    if code == 0:
        return ""
    if code == EXIT_TIMED_OUT:
        return "the command timed out"
    if code == EXIT_INTERRUPTED:
        return "the command was stopped (SIGTERM: `serverless-gpu runs cancel`)"
    return "the command failed (its log says why)"


def _announce(fd: int, run_id: str, log: Path) -> None:
    """Tell the detaching parent the run's id, then write everything to the run's log."""
    os.write(fd, f"{run_id}\n".encode())
    os.close(fd)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
