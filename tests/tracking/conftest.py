"""Fixtures for the MLflow tracking tests: CPU ranks, an embedded SQLite store, a real
``mlflow server`` on 127.0.0.1, and the check that no child process outlives a test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# No usage reporting from test processes (read when mlflow is imported).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Run
from tracking_checks import Server, start_server

from serverless_gpu.tracking import wait_written


@pytest.fixture(autouse=True)
def no_leaks(no_leaked_children: None) -> None:
    """Every tracking test ends with the launcher shut down and no child of ours left."""


@pytest.fixture(autouse=True)
def tracking_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """CPU ranks, fast system-metric sampling, and a fresh experiment per test (its name).

    The working directory is the test's own: MLflow's default store and artifacts go there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    monkeypatch.setenv("SERVERLESS_GPU_SYSTEM_METRICS_INTERVAL", "0.5")
    monkeypatch.setenv("SERVERLESS_GPU_MLFLOW_FLUSH_INTERVAL", "0.2")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    experiment = f"test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)
    return experiment


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose ``mlflow.db`` is created once per module (its schema migrations take
    seconds); tests tell their runs apart by experiment."""
    path = tmp_path_factory.mktemp("embedded")
    with pytest.MonkeyPatch.context() as mp:
        # MLflow caches the store with its default artifact root, ./mlruns, resolved now.
        mp.chdir(path)
        MlflowClient(f"sqlite:///{path}/mlflow.db").search_experiments()
    return path


@pytest.fixture
def embedded(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    """Nothing configured: MLflow's default store, ``sqlite:///mlflow.db`` in the working
    directory (the ranks get the caller's working directory of the call)."""
    monkeypatch.chdir(store_dir)
    assert mlflow.get_tracking_uri() == f"sqlite:///{store_dir}/mlflow.db"
    return MlflowClient()


@pytest.fixture
def experiment_runs(tracking_env: str) -> Callable[[MlflowClient], list[Run]]:
    """The runs of this test's experiment, newest first, once the runs of the calls made so far
    are complete in the store (their end is written behind the call, as a script reading them
    right after its call waits for with ``wait_written``)."""

    def runs(client: MlflowClient) -> list[Run]:
        assert wait_written(60), "the ended calls' runs were not written within 60 s"
        exp = client.get_experiment_by_name(tracking_env)
        return [] if exp is None else list(client.search_runs([exp.experiment_id]))

    return runs


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real server for a module's tests that only read and write through it (starting one
    takes seconds); the tests tell their runs apart by experiment. Not the session's: a worker
    would keep it for every later module it runs."""
    server = start_server(tmp_path_factory.mktemp("server"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def own_mlflow_server(tmp_path: Path) -> Iterator[Server]:
    """A server for one test only (one that the test may kill)."""
    server = start_server(tmp_path)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def remote(mlflow_server: Server, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    """The tracking URI points at the real server (through the environment, as users do)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    return MlflowClient()
