"""One MLflow run per call in MLflow's embedded default store (SQLite in the working directory)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
import tracking_fns
from mlflow import MlflowClient
from mlflow.entities import Run
from tracking_checks import check_run_contents

from serverless_gpu import distributed
from serverless_gpu.tracking import TrackingWarning, store
from serverless_gpu.tracking import hook as tracking_hook_module

RunsOf = Callable[[MlflowClient], list[Run]]


def test_one_run_per_call_with_everything_recorded(
    embedded: MlflowClient,
    experiment_runs: RunsOf,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVERLESS_GPU_MLFLOW_LOG_UPLOAD_INTERVAL", "0.5")
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.log_and_watch_log_upload)

    first = fn.distributed(50, 20.0)
    second = fn.distributed(50, 20.0)

    assert list(first) == [True, True], "rank 0 saw its log uploaded while the run was live"
    runs = experiment_runs(embedded)
    assert {r.info.run_id for r in runs} == {
        first.metadata["mlflow_run_id"],
        second.metadata["mlflow_run_id"],
    }
    for run in runs:
        assert run.info.run_name == "log_and_watch_log_upload"
        assert "mlflow.parentRunId" not in run.data.tags
        check_run_contents(embedded, run, steps=50, function="log_and_watch_log_upload")
    out = capsys.readouterr().out
    run_id, experiment_id = first.metadata["mlflow_run_id"], first.metadata["mlflow_experiment_id"]
    assert out.count(f"MLflow run {run_id}") == 1
    # What a terminal user can run and open: MLflow's own UI command for this store, and the
    # run's page on it.
    uri = first.metadata["mlflow_tracking_uri"]
    port = store.ui_ports(uri)[0]
    assert f"mlflow ui --backend-store-uri {uri} --port {port}" in out
    # The run's link names where a UI for this store will serve, before any does.
    page = (
        f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}{store.RUN_PAGE_QUERY}"
    )
    assert page in out
    assert first.links["mlflow"] == page


def test_nested_under_the_active_run_with_run_name_and_artifacts(
    embedded: MlflowClient, experiment_runs: RunsOf, tmp_path: Path
) -> None:
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300, run_name="finetune")(
        tracking_fns.log_points_and_a_file
    )
    with mlflow.start_run() as parent:
        result = fn.distributed(20, str(tmp_path))

    runs = experiment_runs(embedded)
    assert {r.info.run_id for r in runs} == {parent.info.run_id, result.metadata["mlflow_run_id"]}
    child = embedded.get_run(result.metadata["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.info.experiment_id == parent.info.experiment_id
    assert child.info.run_name == "finetune"
    check_run_contents(embedded, child, steps=20, function="log_points_and_a_file")
    notes = {a.path for a in embedded.list_artifacts(child.info.run_id, "notes")}
    assert notes == {"notes/note_0.txt", "notes/note_1.txt"}


def test_mlflow_run_id_resumes_that_run(
    embedded: MlflowClient,
    experiment_runs: RunsOf,
    tracking_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    existing = embedded.create_run(embedded.create_experiment(tracking_env)).info.run_id
    embedded.log_param(existing, "serverless_gpu.world_size", "8")
    embedded.set_terminated(existing)
    monkeypatch.setenv("MLFLOW_RUN_ID", existing)

    result = distributed(gpus=2, gpu_type="cpu")(tracking_fns.log_points).distributed(10)

    assert result.metadata["mlflow_run_id"] == existing
    assert [r.info.run_id for r in experiment_runs(embedded)] == [existing]
    run = embedded.get_run(existing)
    assert run.info.status == "FINISHED"
    assert len(embedded.get_metric_history(existing, "loss")) == 10
    assert len(embedded.get_metric_history(existing, "rank_1/loss")) == 10
    assert run.data.params["serverless_gpu.world_size"] == "8"  # a resumed run's params stay


def test_tracking_false_creates_no_run(
    embedded: MlflowClient, experiment_runs: RunsOf, recwarn: pytest.WarningsRecorder
) -> None:
    result = distributed(gpus=2, gpu_type="cpu", tracking=False)(
        tracking_fns.no_mlflow
    ).distributed()
    assert list(result) == [0, 1]
    assert not [k for k in result.metadata if k.startswith("mlflow")] and result.links == {}
    assert experiment_runs(embedded) == []
    assert not [w for w in recwarn if issubclass(w.category, TrackingWarning)]


def test_without_mlflow_installed_the_call_runs_and_warns_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The import system's own way of saying "no such module" (not a mock of mlflow's API).
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)
    monkeypatch.setattr(tracking_hook_module, "_missing_mlflow_warned", [])
    fn = distributed(gpus=2, gpu_type="cpu")(tracking_fns.no_mlflow)
    with pytest.warns(TrackingWarning, match="mlflow is not installed") as caught:
        result = fn.distributed()
        assert fn.distributed() == [0, 1]  # a second call does not warn again
    assert list(result) == [0, 1]
    assert len([w for w in caught if issubclass(w.category, TrackingWarning)]) == 1
    assert not [k for k in result.metadata if k.startswith("mlflow")]
