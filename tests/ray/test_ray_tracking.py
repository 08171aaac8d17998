"""One MLflow run per remote call, with the metrics of ranks on both nodes (a local SQLite store:
the ranks' points travel back to the caller, which writes them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import ray_fns

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow import MlflowClient

from serverless_gpu import distributed
from serverless_gpu.tracking import wait_written


def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush_s: str) -> MlflowClient:
    """A SQLite store of the test's own, calls tracked into experiment "ray-test"."""
    monkeypatch.chdir(tmp_path)  # the store's artifacts (./mlruns) land here, not in the repo
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "ray-test")
    monkeypatch.setenv("SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL", flush_s)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    return MlflowClient(uri)


def _runs(client: MlflowClient) -> list[Any]:
    assert wait_written(60), "the ended calls' runs were not written within 60 s"
    experiment = client.get_experiment_by_name("ray-test")
    assert experiment is not None
    return list(client.search_runs([experiment.experiment_id]))


def test_metrics_from_both_nodes_in_one_run(
    cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _store(tmp_path, monkeypatch, "0.2")
    fn = distributed(gpus=4, gpu_type="cpu", remote=True, timeout=180)(ray_fns.log_metrics)

    out = fn.distributed(5)

    assert list(out) == [0, 0, 1, 1]
    runs = _runs(client)
    assert [r.info.run_id for r in runs] == [out.metadata["mlflow_run_id"]], "one run per call"
    run = runs[0]
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    # Rank 0 logs under the plain name, the other ranks under rank_N/ (as locally).
    assert metrics["node"] == 0 and metrics["rank_1/node"] == 0
    assert metrics["rank_2/node"] == 1 and metrics["rank_3/node"] == 1
    for key in ("loss", "rank_1/loss", "rank_2/loss", "rank_3/loss"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(5)), key


def test_a_rank_stopped_by_a_peers_failure_sends_its_points_first(
    cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's kill runs nothing in the actor: the call asks a stopped rank to send the points it
    holds before its actor is killed (here every point: a flush interval longer than the call)."""
    client = _store(tmp_path, monkeypatch, "3600")
    fn = distributed(gpus=2, gpu_type="cpu", remote=True, timeout=180)(ray_fns.log_then_peer_fails)

    with pytest.raises(ValueError, match="rank 1 gave up"):
        fn.distributed(50, str(tmp_path / "marker"))

    [run] = _runs(client)
    assert run.info.status == "FAILED"
    for key in ("loss", "rank_1/loss"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(50)), key
