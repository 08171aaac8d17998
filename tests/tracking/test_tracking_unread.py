"""A run's end is recorded when it ends, whoever reads its handle: a run nobody calls
``result()`` on is FINISHED in MLflow and ``succeeded`` in ``run.json``, not KILLED or lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from eventually import eventually
from mlflow import MlflowClient
from mlflow.entities import Run

from serverless_gpu import distributed
from serverless_gpu.caller.runrecord import read_record

RunsOf = Callable[[MlflowClient], list[Run]]


def add_one(x: int) -> int:
    return x + 1


def _statuses(client: MlflowClient, runs_of: RunsOf) -> list[str]:
    return [r.info.status for r in runs_of(client)]


def test_an_unread_run_is_recorded_finished(
    embedded: MlflowClient, experiment_runs: RunsOf
) -> None:
    fn = distributed(gpus=1, gpu_type="cpu", standby=False, output="none")(add_one)
    h = fn.start(1)
    eventually(
        lambda: _statuses(embedded, experiment_runs) == ["FINISHED"],
        "MLflow shows the unread run FINISHED",
        60.0,
    )
    assert read_record(h.run_dir)["status"] == "succeeded"
    assert list(h.result(0)) == [2], "the result is still there for a late reader"


_EXITS_UNREAD = """
import time
from serverless_gpu import distributed
from serverless_gpu.caller.runrecord import read_record

def add_one(x):
    return x + 1

h = distributed(gpus=1, gpu_type="cpu", standby=False, output="none")(add_one).start(1)
deadline = time.monotonic() + 60
while read_record(h.run_dir).get("status") == "running" and time.monotonic() < deadline:
    time.sleep(0.05)  # the script's own bounded wait, on the record: the handle is never read
print("recorded", read_record(h.run_dir).get("status"))
"""


def test_a_caller_that_exits_without_reading_leaves_the_run_finished(
    embedded: MlflowClient, experiment_runs: RunsOf, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "MLFLOW_TRACKING_URI": embedded.tracking_uri,
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EXITS_UNREAD)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recorded succeeded" in done.stdout, done.stdout + done.stderr[-3000:]
    runs = experiment_runs(embedded)
    assert [r.info.status for r in runs] == ["FINISHED"], [r.data.tags for r in runs]
