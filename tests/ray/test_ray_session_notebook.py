"""notebooks/10_sessions.ipynb with its session on the Ray cluster: each cell of the notebook as
written, the session's first cell asking for ``remote=True``, in a real kernel (nbclient)
connected to the test cluster through RAY_ADDRESS, tracked in a real MLflow store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import mlflow
import nbformat
import pytest
from conftest import leftovers
from nbclient import NotebookClient
from test_ray_notebook import _outputs

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
FIRST = "%%distributed --session gpt gpus=2"


def test_the_sessions_notebook_runs_on_the_cluster(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    monkeypatch.setenv("SERVERLESS_GPU_WARMUP", "0")  # no local standby ranks: none are used
    monkeypatch.setenv("SERVERLESS_GPU_DISPLAY", "text")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]))
    nb = nbformat.read(REPO / "notebooks" / "10_sessions.ipynb", as_version=4)
    firsts = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(FIRST + "\n")]
    assert len(firsts) == 1, "the notebook's first session cell is where remote=True goes"
    firsts[0].source = firsts[0].source.replace(FIRST, FIRST + " remote=True", 1)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )

    client.execute()  # raises on any cell's error

    code = [c for c in nb.cells if c.cell_type == "code"]
    listed = next(
        _outputs(c, "text/plain") for c in code if c.source.startswith("%distributed_session list")
    )
    assert "gpt: 2 ranks alive on Ray node" in listed and "(CPU ranks)" in listed, listed
    runs = mlflow.MlflowClient(store).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(store).search_experiments()]
    )
    (run,) = [r for r in runs if r.info.run_name == "gpt"]
    assert run.info.status == "FINISHED"
    client_ = mlflow.MlflowClient(store)
    steps = client_.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in steps if m.step > 30], "the second training cell went on counting"
    cells = [Path(a.path).name for a in client_.list_artifacts(run.info.run_id, "cells")]
    assert len(cells) == 4, f"each session cell's code: {cells}"
    assert leftovers() == ([], [])
