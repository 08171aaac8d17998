"""``ui()``: the MLflow UI for the embedded store, started once, gone with its process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import psutil
import pytest
import tracking_fns
from mlflow import MlflowClient
from tracking_checks import http_status

from serverless_gpu import distributed
from serverless_gpu.tracking import TrackingWarning, stop_ui, store, ui, wait_written


def test_ui_serves_the_store_and_later_links_point_at_it(embedded: MlflowClient) -> None:
    address = ui()
    try:
        assert ui() == address  # once per process
        result = distributed(gpus=2, gpu_type="cpu")(tracking_fns.no_mlflow).distributed()
        run_id = result.metadata["mlflow_run_id"]
        experiment = result.metadata["mlflow_experiment_id"]
        page = f"{address}/#/experiments/{experiment}/runs/{run_id}{store.RUN_PAGE_QUERY}"
        assert result.links["mlflow"] == page
        assert http_status(result.links["mlflow"]) == 200
        # The same store behind it: the UI's own API knows the run.
        assert http_status(f"{address}/ajax-api/2.0/mlflow/runs/get?run_id={run_id}") == 200
        assert wait_written(60)
        assert embedded.get_run(run_id).info.status == "FINISHED"
    finally:
        stop_ui()
    assert http_status(f"{address}/health") is None


def test_ui_server_dies_with_the_process_that_started_it(store_dir: Path) -> None:
    script = (
        "import time\n"
        "from serverless_gpu.tracking import ui\n"
        "print(ui(), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], cwd=store_dir, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        address = owner.stdout.readline().strip()
        assert http_status(f"{address}/health") == 200
        group = psutil.Process(owner.pid).children(recursive=True)
        assert group, "the guard and the server run as children of their owner"
        os.kill(owner.pid, signal.SIGKILL)  # no atexit, no cleanup: only the guard's pipe
        owner.wait()
        _, alive = psutil.wait_procs(group, timeout=20)
        assert not alive, [p.cmdline() for p in alive]
        assert http_status(f"{address}/health") is None
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_ui_first_in_a_fresh_folder_leaves_tracking_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UI server creates the store and its default experiment; runs made afterwards from
    this process still log into it."""
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    assert not (tmp_path / "mlflow.db").exists()
    address = ui()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = distributed(gpus=2, gpu_type="cpu")(tracking_fns.log_points).distributed(5)
            assert wait_written(60)
        assert not [str(w.message) for w in caught if w.category is TrackingWarning]
        client = MlflowClient()
        assert wait_written(60)
        run = client.get_run(result.metadata["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert len(client.get_metric_history(run.info.run_id, "loss")) >= 5
        logs = {a.path for a in client.list_artifacts(run.info.run_id, "logs")}
        assert logs == {"logs/rank_0.txt", "logs/rank_1.txt"}
        # The UI shows the same artifacts.
        artifact = f"{address}/get-artifact?path=logs/rank_0.txt&run_uuid={run.info.run_id}"
        assert http_status(artifact) == 200
    finally:
        stop_ui()
