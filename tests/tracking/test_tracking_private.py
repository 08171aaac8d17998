"""What tracking writes stays private to the user: a store it creates, the artifacts it uploads,
and the MLflow UI's log files (pruned when their process is gone)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tracking_fns
from mlflow import MlflowClient

from serverless_gpu import distributed
from serverless_gpu.tracking import stop_ui, ui, wait_written


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_store_tracking_creates_and_the_logs_it_uploads_are_private(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert not (tmp_path / "mlflow.db").exists()
    result = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.no_mlflow).distributed()
    # Creating the store is MLflow's business, not news for the user.
    assert "database tables" not in capfd.readouterr().err
    assert _mode(tmp_path / "mlflow.db") == 0o600
    assert _mode(tmp_path / "mlruns") == 0o700
    assert wait_written(60)
    run = MlflowClient().get_run(result.metadata["mlflow_run_id"])
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    for name in ("rank_0.txt", "rank_1.txt"):
        assert _mode(artifacts / "logs" / name) == 0o600


def test_ui_logs_of_gone_processes_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "runs"  # the private runs root holds them
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(logs))
    logs.mkdir(mode=0o700)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    stale = logs / f"mlflow-ui-{int(gone.stdout)}-0a1b2c3d.log"
    live = logs / f"mlflow-ui-{os.getppid()}-0a1b2c3d.log"
    other = logs / "mlflow-ui-notes.log"
    for path in (stale, live, other):
        path.write_text("x\n")
    ui()
    try:
        assert not stale.exists()
        assert live.exists() and other.exists()
        [own] = logs.glob(f"mlflow-ui-{os.getpid()}-*.log")
        assert _mode(own) == 0o600
    finally:
        stop_ui()
