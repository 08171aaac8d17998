"""Fixtures for the command line and the drop-ins: a private MLflow store and runs folder per
test, the command run as a real process, and the check that no process of ours survives."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow import MlflowClient

Cli = Callable[..., subprocess.CompletedProcess[str]]
COMMAND = [sys.executable, "-m", "serverless_gpu.cli"]
"""The ``serverless-gpu`` console script runs the same function (``serverless_gpu.cli:main``)."""


@pytest.fixture(autouse=True)
def no_leaks(no_leaked_children: None) -> None:
    """Every test ends with the launcher shut down and no child of ours left."""


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store per module (creating its schema takes seconds)."""
    path = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{path}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path)  # the store's default artifact root, ./mlruns, is resolved now
        MlflowClient(uri).search_experiments()
    return uri


@pytest.fixture(autouse=True)
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, store_uri: str) -> str:
    """The test's own working directory, runs folder and MLflow experiment (its name)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "SERVERLESS_GPU_TYPE"):
        monkeypatch.delenv(name, raising=False)
    experiment = f"cli-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)
    return experiment


@pytest.fixture
def client(store_uri: str) -> MlflowClient:
    return MlflowClient(store_uri)


@pytest.fixture
def cli() -> Cli:
    """``cli("run", ...)``: the command as a process, its status and output (bounded)."""

    def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*COMMAND, *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    return run


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write("train.py", source)``: a file in the test's working directory."""

    def write_file(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write_file
