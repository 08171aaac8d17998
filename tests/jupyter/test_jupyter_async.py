"""Concurrent runs in a real kernel (nbclient): ``fn.map`` draws one table that a background
poll keeps updating after the cell returned; per-run Cancel and Cancel all; ``%%distributed
--async --out h`` binds a handle."""

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
import os, time
os.environ["SERVERLESS_GPU_CPU_SLOTS"] = "2"
from serverless_gpu import distributed
from jupyter_ext import hook
from jupyter_ext.run_table import text_summary

@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
def trial(x: float) -> float:
    time.sleep(abs(x) / 10)
    if x < 0:
        raise ValueError("negative x")
    return x * 2
"""
MAP = "handles = trial.map([{'x': 1}, {'x': 2}, {'x': -1}])"
# Only statuses are read here: nothing in this cell pumps the handles' events, so they change
# only through the table's background poll.
AFTER = """\
deadline = time.time() + 90
while not all(h.status.finished for h in handles) and time.time() < deadline:
    time.sleep(0.2)
print("statuses", [h.status.value for h in handles])
print(text_summary(list(hook._tables.values())[-1]))
"""
CANCEL = """\
more = trial.map([{'x': 600}, {'x': 600}, {'x': 600}])
table = list(hook._tables.values())[-1]
time.sleep(1)
table.rows[0].cancel_button.click()
more[0].wait(60)
print("one", [h.status.value for h in more])
table.cancel_all.click()
print("all", [h.wait(60) and h.status.value for h in more])
"""
ASYNC = """\
%%distributed --async --out h gpus=1 gpu_type=cpu --no-tracking
import time
time.sleep(1)
41 + 1
"""
BOUND = "print(type(h).__name__, h.result(60)[0], h.status.value)"


def _text(cell: Any) -> str:
    parts = [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
    parts += ["\n".join(o.get("traceback", [])) for o in cell.outputs if o.output_type == "error"]
    return ANSI.sub("", "\n".join(parts))


def test_map_table_background_poll_cancel_and_async_magic(tmp_path: Path) -> None:
    sources = [SETUP, MAP, AFTER, CANCEL, ASYNC, BOUND]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    setup, mapped, after, cancel, started, bound = nb.cells
    assert not [o for o in setup.outputs if o.output_type == "error"], _text(setup)
    assert any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in mapped.outputs
    ), "the table widget was not displayed"
    text = _text(after)
    assert "statuses ['succeeded', 'succeeded', 'failed']" in text, text
    rows = text.splitlines()[2:]
    assert rows[0].startswith("0 | x=1 | succeeded") and "[2]" not in rows[0]
    assert "2" in rows[0].split(" | ")[4]
    assert rows[2].startswith("2 | x=-1 | failed") and "negative x" in rows[2], rows
    cancelled = _text(cancel)
    assert "one ['cancelled', " in cancelled, cancelled
    assert "all ['cancelled', 'cancelled', 'cancelled']" in cancelled, cancelled
    assert not _text(started).strip() or "Error" not in _text(started)
    assert "RunHandle 42 succeeded" in _text(bound), _text(bound)
