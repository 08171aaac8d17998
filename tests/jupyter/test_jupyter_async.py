"""Concurrent runs in a real kernel (nbclient): ``fn.map`` draws one table that a background
poll keeps updating after the cell returned, and that leaves a static record (HTML and text,
no widget) in the saved notebook once its runs end; per-run Cancel and Cancel all;
``%%distributed --async --out h`` binds a handle."""

from __future__ import annotations

import queue
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from eventually import eventually
from jupyter_helpers import ANSI, Kernel
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(240)

SETUP = """\
%load_ext serverless_gpu
import os, time
os.environ["SERVERLESS_GPU_CPU_SLOTS"] = "2"
from serverless_gpu import distributed
from jupyter_ext import hook

@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False, timeout=120)
def trial(x: float, scale: float = 1.0) -> float:
    time.sleep(abs(x) / 10)
    if x < 0:
        raise ValueError("negative x")
    return x * 2 * scale


def recorded(table, seconds=30):
    # Until the table has left its record: sent while this cell runs, nbclient takes it
    # into the earlier cell's output, as a browser would.
    deadline = time.time() + seconds
    while not getattr(table, "record", "") and time.time() < deadline:
        time.sleep(0.1)
    return bool(getattr(table, "record", ""))
"""
# Positional and keyword items: the table names both by the function's parameters.
MAP = "handles = trial.map([(1,), {'x': 2, 'scale': 1 / 3}, {'x': -1}])"
# Only statuses are read here: nothing in this cell pumps the handles' events, so they change
# only through the table's background poll.
AFTER = """\
deadline = time.time() + 90
while not all(h.status.finished for h in handles) and time.time() < deadline:
    time.sleep(0.2)
print("statuses", [h.status.value for h in handles])
table = list(hook._tables.values())[-1]
print("recorded", recorded(table))
print(table.text())
"""
# The messages a browser sends for a row's Cancel and for Cancel all.
CANCEL = """\
more = trial.map([{'x': 600}, {'x': 600}, {'x': 600}])
table = list(hook._tables.values())[-1]
table._on_message(table.table, {"type": "cancel", "trial": 0}, [])
more[0].wait(60)
print("one", [h.status.value for h in more], "armed", not table.table.ended)
table._on_message(table.table, {"type": "cancel_all"}, [])
print("all", [h.wait(60) and h.status.value for h in more])
print("recorded", recorded(table))
"""
ASYNC = """\
%%distributed --async --out h gpus=1 gpu_type=cpu --no-tracking
import time
time.sleep(1)
41 + 1
"""
BOUND = "print(type(h).__name__, h.result(60)[0], h.status.value)"


def _static_record(cell: Any) -> dict[str, str]:
    """The cell's one display output, which must be the table's record: static HTML and its
    text form, nothing that needs a widget (a kernel) to draw."""
    shown = [o for o in cell.outputs if o.output_type == "display_data"]
    assert len(shown) == 1, cell.outputs
    data = shown[0]["data"]
    assert set(data) == {"text/html", "text/plain"}, data.keys()
    assert "sgpu-table-record" in data["text/html"] and "VBox(" not in data["text/plain"]
    return dict(data)


def _check_record(cell: Any, live_text: str) -> None:
    """Columns by parameter name, values rounded, one row per trial, each trial's record."""
    record = _static_record(cell)
    lines = record["text/plain"].splitlines()
    assert lines[0] == "trial: 3 trials: 2 succeeded, 1 failed", lines
    head, *rows = lines[1:]
    columns = ["trial", "x", "scale", "status", "queued", "run time", "result / error"]
    assert re.split(r"\s{2,}", head) == columns, head
    assert rows[0].split()[:3] == ["0", "1", "succeeded"] and rows[0].endswith(" 2"), rows
    # 2 * 2 / 3, rounded; the scale as given (1 / 3), rounded too.
    assert rows[1].split()[:4] == ["1", "2", "0.3333", "succeeded"], rows
    assert rows[1].endswith(" 1.333"), rows
    assert rows[2].split()[:3] == ["2", "-1", "failed"] and "negative x" in rows[2], rows
    assert "\n".join(lines) in live_text  # what the live table's text form said at the end
    html = record["text/html"]
    assert html.count('class="sgpu-trial-row"') == 3 and "<th" in html, html
    assert html.count('class="sgpu-trial-record"') == 3, html  # details, folded
    assert "arg0" not in html and ">0.3333</td>" in html and "<code>1.333</code>" in html, html


def _text(cell: Any) -> str:
    # A stream's text as printed: a display sent meanwhile by a background thread (the table's
    # record) splits it into two outputs, even in the middle of one print().
    parts = ["".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")]
    parts += ["\n".join(o.get("traceback", [])) for o in cell.outputs if o.output_type == "error"]
    return ANSI.sub("", "\n".join(parts))


def test_map_table_background_poll_cancel_and_async_magic(tmp_path: Path) -> None:
    sources = [SETUP, MAP, AFTER, CANCEL, ASYNC, BOUND]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    nbformat.write(nb, tmp_path / "saved.ipynb")
    saved = nbformat.read(tmp_path / "saved.ipynb", as_version=4)
    setup, mapped, after, cancel, started, bound = saved.cells
    assert not [o for o in setup.outputs if o.output_type == "error"], _text(setup)
    text = _text(after)
    assert "statuses ['succeeded', 'succeeded', 'failed']" in text, text
    assert "recorded True" in text, text
    _check_record(mapped, text)
    cancelled = _text(cancel)
    assert "one ['cancelled', " in cancelled and "armed True" in cancelled, cancelled
    assert "all ['cancelled', 'cancelled', 'cancelled']" in cancelled, cancelled
    assert "recorded True" in cancelled, cancelled
    record = _static_record(cancel)
    assert record["text/html"].count('data-status="cancelled"') == 3, record["text/html"]
    assert not _text(started).strip() or "Error" not in _text(started)
    assert "RunHandle 42 succeeded" in _text(bound), _text(bound)


LONG_TRIALS = """\
import os
os.environ["SERVERLESS_GPU_CPU_SLOTS"] = "2"
from serverless_gpu import distributed

@distributed(gpus=1, gpu_type="cpu", tracking=False, standby=False)
def wait(seconds: float) -> float:
    import time
    time.sleep(seconds)
    return seconds

handles = wait.map([600.0, 600.0])
import time
deadline = time.time() + 60
while any(h.status.value != "running" for h in handles) and time.time() < deadline:
    time.sleep(0.1)
print("statuses", [h.status.value for h in handles])
"""


def _table_update(kernel: Kernel) -> dict[str, Any] | None:
    """The next IOPub message, when it is a display update carrying a runs table's record."""
    try:
        msg = kernel.client.get_iopub_msg(timeout=0.2)
    except queue.Empty:
        return None
    data = msg["content"].get("data", {}) if msg["msg_type"] == "update_display_data" else {}
    return dict(data) if "sgpu-table-record" in data.get("text/html", "") else None


def test_kernel_shutdown_leaves_the_tables_record(kernel: Kernel) -> None:
    """A kernel asked to shut down (or restart) while trials run still sends each table's
    record, for a client that listens until the kernel is gone (nbclient, a notebook saved by
    the server)."""
    out = kernel.run(LONG_TRIALS)
    assert "statuses ['running', 'running']" in out.all_text, out.all_text
    kernel.client.shutdown(restart=True)
    data = eventually(lambda: _table_update(kernel), "the table's record at shutdown", 30)
    assert set(data) == {"text/html", "text/plain"}, data.keys()
    assert data["text/html"].count('class="sgpu-trial-row"') == 2, data["text/html"]
    lines = data["text/plain"].splitlines()
    # Stopped as the kernel exits; on a loaded machine the runs may not report their end within
    # the bounded wait, and the record says so.
    assert lines[0] in ("wait: 2 trials: 2 cancelled", "wait: 2 trials: 2 unfinished"), lines
    # The kernel's exit is the reason, not the launcher's own shutdown.
    assert all("the kernel shut down" in line for line in lines[2:]), lines
    assert not any("launcher" in line for line in lines), lines
