"""``RunHandle.from_run_id`` on runs started with ``serverless-gpu run --detach``: status,
logs, links and the outcome, read from the run directory by this (another) process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import Cli
from eventually import eventually

from serverless_gpu import CancelledError, RunHandle
from serverless_gpu.caller.reattach import RecordedRun
from serverless_gpu.compat import TERMINAL_STATUSES, WorkloadStatus, stop

GATED = """
    import os
    import time

    rank = os.environ["RANK"]
    print(f"rank {rank} waiting", flush=True)
    while not os.path.exists("gate"):
        time.sleep(0.05)
    print(f"rank {rank} through", flush=True)
"""

FAILS = """
    import os

    if os.environ["RANK"] == "1":
        raise KeyError("no such shard")
"""


def _detach(cli: Cli, tmp_path: Path, script: str) -> tuple[str, psutil.Process]:
    started = cli("run", "--detach", "--gpus", "2", "--gpu-type", "cpu", script)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[0]
    (record,) = (tmp_path / "runs").glob(f"*-{run_id}/run.json")
    return run_id, psutil.Process(json.loads(record.read_text())["cli_pid"])


def test_a_detached_run_is_followed_and_its_outcome_read(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path, capsys: Any
) -> None:
    write("gated.py", GATED)
    run_id, detached = _detach(cli, tmp_path, "gated.py")
    try:
        h = RunHandle.from_run_id(run_id)
        assert isinstance(h, RecordedRun)
        assert h.status == WorkloadStatus.RUNNING and h.status not in TERMINAL_STATUSES
        eventually(lambda: "rank 1 waiting" in h.logs(1), "rank 1's log, read back")
        assert h.links["mlflow"].startswith("http") or "#/experiments/" in h.links["mlflow"]
        meta = h.workload_metadata
        assert (meta.name, meta.gpus, meta.workload_run) == ("gated.py", 2, run_id)
        (tmp_path / "gate").touch()
        assert h.result(timeout=120, logs=True) == [None, None]  # a script's ranks return None
    finally:
        (tmp_path / "gate").touch()
        detached.wait(60)
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert out.count(f"[rank {rank}] rank {rank} through\n") == 1, out
    assert h.status == WorkloadStatus.COMPLETED and h.status in TERMINAL_STATUSES


def test_a_detached_failure_is_raised_with_the_ranks_own_type(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("fails.py", FAILS)
    run_id, detached = _detach(cli, tmp_path, "fails.py")
    h = RunHandle.from_run_id(run_id[:8])
    with pytest.raises(KeyError, match="no such shard") as caught:
        h.result(timeout=120)
    assert getattr(caught.value, "serverless_gpu_rank", None) == 1
    assert h.status == WorkloadStatus.FAILED
    detached.wait(60)


def test_a_detached_run_is_stopped(
    cli: Cli, write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write("gated.py", GATED)
    run_id, detached = _detach(cli, tmp_path, "gated.py")
    h = RunHandle.from_run_id(run_id)
    eventually(lambda: "waiting" in h.logs(0), "the run's ranks started")
    stop(h)
    assert h.wait(60) and h.status == WorkloadStatus.STOPPED
    with pytest.raises(CancelledError):
        h.result(0)
    detached.wait(60)
