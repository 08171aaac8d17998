"""A notebook executed headless (nbclient, papermill) keeps its run records: each record is
complete in the saved notebook when the cell that waited returns, the MLflow link included.
No cell sleeps after its wait: a record written later by a background thread would be lost,
and this test would fail."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import papermill
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(300)

_MLFLOW_LINK = re.compile(
    r'<a class="sgpu-link" data-link="mlflow" href="(http://127\.0\.0\.1:[^"]+)"'
)
CELLS = [
    "%load_ext jupyter_ext",
    '%%distributed --async --out h gpus=1 gpu_type=cpu\n"forty-two"',
    "print(h.result(120)[0])",
    "from serverless_gpu import distributed\n"
    "@distributed(gpus=1, gpu_type='cpu')\n"
    "def double(x):\n"
    "    return 2 * x\n"
    "hs = double.map([3, 4])",
    "print([x.result(120)[0] for x in hs])",  # the last cell: nothing runs after it
]


def _notebook() -> Any:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])


@pytest.fixture
def tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Kernels with tracking on (other tests' kernels turn it off) in a store of the test's."""
    profile = tmp_path / "ipython-tracked" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.HistoryManager.enabled = False\n")
    monkeypatch.setenv("IPYTHONDIR", str(profile.parent))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return tmp_path


def _nbclient(folder: Path) -> Any:
    nb = _notebook()
    NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    return nb


def _papermill(folder: Path) -> Any:
    source, saved = folder / "in.ipynb", folder / "out.ipynb"
    nbformat.write(_notebook(), source)
    papermill.execute_notebook(
        str(source), str(saved), kernel_name="python3", cwd=str(folder), progress_bar=False
    )
    return nbformat.read(saved, as_version=4)


def _html(cell: Any) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)


def _plain(cell: Any) -> str:
    return "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)


@pytest.mark.parametrize("execute", [_nbclient, _papermill], ids=["nbclient", "papermill"])
def test_a_notebook_run_headless_saves_complete_records(tracked: Path, execute: Any) -> None:
    nb = execute(tracked)
    record = _html(nb.cells[1])
    assert "sgpu-record" in record, nb.cells[1].outputs
    assert "str &#x27;forty-two&#x27;" in record, record
    assert len(_MLFLOW_LINK.findall(record)) == 1, record
    assert "starting the MLflow UI" not in record, record
    table, text = _html(nb.cells[3]), _plain(nb.cells[3])
    assert "no trials yet" not in table + text, nb.cells[3].outputs
    assert "sgpu-table-record" in table or "<table" in table, nb.cells[3].outputs
    for value in ("6", "8"):
        assert re.search(rf"<code>{value}</code>|>{value}<", table), table
    assert len(_MLFLOW_LINK.findall(table)) >= 2, table
