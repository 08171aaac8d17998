"""How session cells read in a saved notebook (executed by nbclient, widgets drawn): a quick
cell that succeeds is its ``Out[n:k]`` lines and one status line, its record folded; cells are
named by the notebook's execution count; a failed cell keeps its full record; a restart is one
line; nothing saved carries a local path."""

from __future__ import annotations

import re
from typing import Any

import nbformat
import pytest
from jupyter_helpers import KernelFactory
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(240)

START = "%%distributed --session s gpus=2 gpu_type=cpu --no-tracking\n"
CELL = "%%distributed --session s\n"
CELLS = [
    "%load_ext jupyter_ext",
    START + "import os\nos.getpid()",
    CELL + "{'a': 1, 'b': 2, 'c': 3}",
    CELL + "raise ValueError('bad value')",
    "%distributed_session restart s",
    CELL + "1",
]


def _lines(cell: Any) -> list[str]:
    """What a reader sees of the cell: the text of each output (a record: its text form)."""
    text = []
    for out in cell.outputs:
        if out.output_type == "stream":
            text.append(out.text)
        elif "data" in out:
            text.append(out.data.get("text/plain", ""))
    return [
        line for line in "".join(t if t.endswith("\n") else t + "\n" for t in text).splitlines()
    ]


def _html(cell: Any) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("session-cells")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    ).execute()
    return nb


def test_a_quick_cell_is_its_values_and_one_status_line(saved: Any) -> None:
    quick = saved.cells[2]
    lines = _lines(quick)
    assert len(lines) <= 4, lines
    assert sum(line.startswith(f"Out[{quick.execution_count}:") for line in lines) == 2, lines
    assert "sgpu-record" in _html(quick)
    assert "<details" in _html(quick) and " open>" not in _html(quick).split("</summary>")[0]


def test_cells_are_named_by_the_notebooks_execution_count(saved: Any) -> None:
    for index in (1, 2, 5):
        cell = saved.cells[index]
        assert f"s In[{cell.execution_count}]" in "\n".join(_lines(cell)), _lines(cell)
    assert "s cell " not in "".join("\n".join(_lines(c)) for c in saved.cells)


def test_a_failed_cell_keeps_its_full_record(saved: Any) -> None:
    failed = saved.cells[3]
    assert "ValueError: bad value" in "".join(o.get("evalue", "") for o in failed.outputs) or (
        "bad value" in "\n".join(_lines(failed))
    )
    assert '<details class="sgpu-record-rank"' in _html(failed), _html(failed)


def test_a_restart_is_one_line(saved: Any) -> None:
    assert len(_lines(saved.cells[4])) == 1, _lines(saved.cells[4])


def test_no_saved_output_carries_a_local_path(saved: Any) -> None:
    outputs = str([cell.get("outputs", []) for cell in saved.cells])
    assert not re.search(r"/\S*/logs\b", outputs), outputs
    assert "serverless-gpu runs logs " in outputs  # how to read the logs instead


def test_a_new_session_says_at_once_what_it_waits_for(make_kernel: KernelFactory) -> None:
    kernel = make_kernel(SERVERLESS_GPU_DISPLAY="widget")
    cell = kernel.start(START + "1")
    assert kernel.collect(cell, 30, until=lambda: bool(cell.text))
    first = cell.text[0]  # before the session's run (its MLflow run, the launcher) is made
    assert "session 's' starting: 2 x cpu; waiting for the launcher" in first, cell.text
    assert kernel.collect(cell, 120, until=lambda: cell.done)
    assert "session 's' started (" in cell.all_text, cell.all_text
