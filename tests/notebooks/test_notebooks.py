"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient), in CPU mode,
under its own time limit; any error fails the test. The executed copy is written to the test's
temporary folder, never over the tracked notebook."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# Hang bounds, not speed claims: seconds for any one cell (nbclient) and, plus 30, for the whole
# notebook (pytest-timeout). One entry per notebook: a new notebook without one fails its test.
# A notebook takes 1-2 minutes on a 2-core CPU machine (DeepSpeed's first run also builds its op).
LIMITS = {
    "01_quickstart": 300,
    "02_fsdp2": 300,
    "03_deepspeed": 600,
    "04_hf_trainer": 300,
    "05_lightning_fabric": 300,
    "06_data_and_resume": 300,
    "07_magic_and_widget": 300,
    "08_sweeps": 300,
    "09_migration": 300,
}


def _params() -> list[object]:
    return [
        pytest.param(path, marks=pytest.mark.timeout(LIMITS.get(path.stem, 1) + 30), id=path.stem)
        for path in sorted(NOTEBOOKS.glob("*.ipynb"))
    ]


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for all the notebooks: creating a store costs seconds, each time."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.mark.parametrize("path", _params())
def test_notebook_runs(
    path: Path,
    tmp_path: Path,
    mlflow_store: str,
    monkeypatch: pytest.MonkeyPatch,
    no_leaked_children: None,
) -> None:
    assert path.stem in LIMITS, f"give {path.name} a time limit in LIMITS"
    monkeypatch.setenv("SERVERLESS_GPU_TYPE", "cpu")
    monkeypatch.setenv("SERVERLESS_GPU_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    # DeepSpeed's compiled CPU op is kept with the environment, so only the first run builds it.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for name in ("ACCELERATE_USE_CPU", "GLOO_SOCKET_IFNAME", "SERVERLESS_GPU_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=LIMITS[path.stem],
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        nbformat.write(nb, tmp_path / path.name)
        print(f"executed copy: {tmp_path / path.name}", file=sys.stderr)
    assert os.path.getsize(tmp_path / path.name) > 0
