"""The documented flow in a real kernel: ``hs = f.map(...)`` draws the runs table, whose
background poll reads each finished run's ``result(0)`` while the cell reads ``h.result()``;
the cell gets every result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_helpers import ANSI
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(240)

SETUP = """\
%load_ext serverless_gpu
import os
os.environ["SERVERLESS_GPU_CPU_SLOTS"] = "2"
from serverless_gpu import distributed

@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
def double(x: int) -> tuple[int, bytes]:
    return x * 2, b"r" * (16 << 20)  # a result that takes a moment to load
"""
READ = """\
for attempt in range(3):
    hs = double.map(range(8))
    try:
        print("values", [h.result()[0][0] for h in hs])
    except Exception as exc:
        print("lost", type(exc).__name__, exc)
"""


def _text(cell: Any) -> str:
    parts = [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
    parts += ["\n".join(o.get("traceback", [])) for o in cell.outputs if o.output_type == "error"]
    return ANSI.sub("", "\n".join(parts))


def test_map_then_read_every_result_while_the_table_polls(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in (SETUP, READ)])
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    setup, read = nb.cells
    assert not [o for o in setup.outputs if o.output_type == "error"], _text(setup)
    text = _text(read)
    expected = "values [0, 2, 4, 6, 8, 10, 12, 14]"
    assert text.count(expected) == 3, text
