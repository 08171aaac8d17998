"""One MLflow run per session: every cell's metrics in it, steps going on across cells, each
cell's code as an artifact; FINISHED at close, FAILED when a crash ended it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow
from mlflow import MlflowClient

from serverless_gpu import RankFailedError, Session
from serverless_gpu.tracking import wait_written


@pytest.fixture(scope="module")
def store(
    module_launcher: None, cwd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowClient]:
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL", "0.2")
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "sessions")
        mlflow.set_tracking_uri(uri)
        yield MlflowClient(uri)
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # back to MLflow's default


TRAIN = (
    "import mlflow\n"
    "for _ in range(3):\n"
    "    step += 1\n"
    "    mlflow.log_metric('loss', 1.0 / step, step=step)\n"
)


def test_one_run_per_session_with_every_cells_metrics_and_code(store: MlflowClient) -> None:
    with (
        mlflow.start_run(run_name="notebook") as parent,
        Session(gpus=2, gpu_type="cpu", run_name="train-session") as sess,
    ):
        sess.exec("step = 0")
        sess.exec(TRAIN)
        sess.exec(TRAIN)
        run_id = sess.handle.context.metadata["mlflow_run_id"]
        assert store.get_run(run_id).info.status == "RUNNING"
    assert wait_written(60)  # the session's run is ended behind its close
    run = store.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "train-session"
    assert run.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    history = store.get_metric_history(run_id, "loss")
    steps = sorted({m.step for m in history})
    assert steps == [1, 2, 3, 4, 5, 6]  # both training cells, one curve
    cells = sorted(Path(a.path).name for a in store.list_artifacts(run_id, "cells"))
    assert cells == ["0001.py", "0002.py", "0003.py"]
    text = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="cells/0002.py"))
    assert "log_metric" in text.read_text()


def test_a_crash_ends_the_run_failed(store: MlflowClient) -> None:
    sess = Session(gpus=2, gpu_type="cpu", run_name="crashing")
    run_id = sess.handle.context.metadata["mlflow_run_id"]
    with pytest.raises(RankFailedError):
        sess.exec(
            "import os\nif os.environ['RANK'] == '0':\n    os._exit(1)\nimport time\ntime.sleep(30)"
        )
    sess.close()
    assert wait_written(60)
    assert store.get_run(run_id).info.status == "FAILED"
