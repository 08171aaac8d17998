"""A tracked function's decoration prepares what its first call's MLflow setup needs (in the
warm-up thread, beside the launcher's start): the imports, and a SQLite store that exists
opened (engine, schema check). It creates no store: a function decorated and never called
leaves no file. An untracked one imports nothing of MLflow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from procs import run_script

_CALLER = """
import sys
from serverless_gpu import distributed, shutdown
from serverless_gpu.api.prewarm import join_prewarm

def train():
    return 1

distributed(gpus=2, gpu_type="cpu", tracking=sys.argv[1] == "tracked")(train)
join_prewarm(60)
wanted = ("mlflow", "mlflow.store.tracking.sqlalchemy_store", "serverless_gpu.tracking.tracker")
print("IMPORTED", *[m in sys.modules for m in wanted])
if "mlflow" in sys.modules:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    print("OPENED", sorted(SqlAlchemyStore._engine_map))
shutdown()
"""


def _caller(tmp_path: Path, how: str, uri: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["SERVERLESS_GPU_RUNS_DIR"] = str(tmp_path / "runs")
    if uri is not None:
        env["MLFLOW_TRACKING_URI"] = uri
    done = run_script(_CALLER, how, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("tracked", [True, False])
def test_decorating_imports_mlflow_ahead_and_makes_no_store(tmp_path: Path, tracked: bool) -> None:
    out = _caller(tmp_path, "tracked" if tracked else "untracked", None)
    assert f"IMPORTED {tracked} {tracked} {tracked}" in out, out
    if tracked:
        assert "OPENED []" in out, out
    # the default store (sqlite:///mlflow.db here) is made by the first call, not before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_decorating_opens_a_store_that_exists(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    made = "import mlflow, sys; mlflow.MlflowClient(sys.argv[1]).search_experiments()"
    assert run_script(made, uri, cwd=tmp_path).returncode == 0
    out = _caller(tmp_path, "tracked", uri)
    assert f"OPENED ['{uri}']" in out, out
