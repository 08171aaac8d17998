"""``%%distributed ... remote=True`` in a real kernel (nbclient) connected to the test cluster
through RAY_ADDRESS: every rank's value back, and the widget's record naming each rank's node."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
CELL = (
    "%%distributed gpus=4 gpu_type=cpu remote=True timeout=180 --no-tracking\n"
    "from serverless_gpu import runtime\n"
    "print(f'rank {runtime.get_global_rank()} on node {runtime.get_node_rank()}')\n"
    "runtime.get_node_rank()\n"
)
SHORT_WAIT = "import os; os.environ['SERVERLESS_GPU_RAY_RESERVE_TIMEOUT'] = '4'"
TOO_BIG = "%%distributed gpus=6 gpu_type=cpu remote=True timeout=180 --no-tracking\npass\n"
"""The cluster has 4 CPUs: the reservation waits, and the widget says what is missing."""


def _outputs(cell: Any, mime: str) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append("\n".join(output.traceback))
        else:
            parts.append(output.get("data", {}).get(mime, ""))
    return "\n".join(parts)


def test_magic_cell_on_the_cluster_shows_each_ranks_node(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("SERVERLESS_GPU_DISPLAY", "widget")
    monkeypatch.setenv("SERVERLESS_GPU_WARMUP", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext jupyter_ext"),
        nbformat.v4.new_code_cell(CELL),
        nbformat.v4.new_code_cell(SHORT_WAIT),
        nbformat.v4.new_code_cell(TOO_BIG),
    ]
    client = NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )

    client.execute()

    cell = nb.cells[1]
    assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
    plain, page = _outputs(cell, "text/plain"), _outputs(cell, "text/html")
    assert "[0, 0, 1, 1]" in plain, plain
    assert "4 x CPU on 2 Ray nodes" in page, page
    for rank, node in enumerate([0, 0, 1, 1]):
        assert f"rank {rank} on node {node} (127.0.0.1)" in page, page
        assert f"rank {rank} on node {node}\n" in page  # the rank's own output

    waited = _outputs(nb.cells[3], "text/html")
    said = "waiting for the Ray cluster: 6 ranks of 1 CPU requested, 4 CPU free"
    assert said in waited, waited
    assert "could not hold 6 ranks" in _outputs(nb.cells[3], "text/plain"), nb.cells[3].outputs
