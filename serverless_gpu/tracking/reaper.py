"""Runs left RUNNING by a caller that died without a word (SIGKILL, power loss of a kernel):
the next tracked call on the same host ends them as KILLED, as the caller's exit handler would
have."""

from __future__ import annotations

import socket

import psutil
from mlflow import MlflowClient

from serverless_gpu.tracking import records

_MAX_RUNS = 1000


def end_orphaned_runs(client: MlflowClient) -> list[str]:
    """End the RUNNING runs of this host whose calling process is gone; their ids."""
    host = socket.gethostname()
    if "'" in host:
        return []  # not expressible in a search filter; such runs stay as they are
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    runs = client.search_runs(
        experiments,
        filter_string=f"attributes.status = 'RUNNING' and tags.`{records.HOST_TAG}` = '{host}'",
        max_results=_MAX_RUNS,
    )
    ended = []
    for run in runs:
        tags = run.data.tags
        pid, started = tags.get(records.OWNER_PID_TAG), tags.get(records.OWNER_STARTED_TAG)
        if pid is None or started is None or owner_alive(pid, started):
            continue
        client.set_tag(run.info.run_id, records.ERROR_TAG, records.CALLER_EXITED)
        client.set_terminated(run.info.run_id, "KILLED")
        ended.append(run.info.run_id)
    return ended


def owner_alive(pid: str, started: str) -> bool:
    """Is the process that made the run still running? Unknown counts as yes."""
    try:
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.01
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, ValueError):
        return True
