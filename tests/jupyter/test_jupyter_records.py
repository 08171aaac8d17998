"""A run's cell in a real kernel (issue 28): the kernel's status stays busy while the cell waits
on a run, whatever else the kernel handles meanwhile; an ``--async --out`` record names its
result's value."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_helpers import Kernel
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(240)

LONG_RUN = """%%distributed gpus=2 gpu_type=cpu --no-tracking
import time
for step in range(300):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
"""


def _statuses(kernel: Kernel, cell: str, until: float) -> list[tuple[str, str]]:
    """(state, what it is about) of each status message up to ``until``."""
    seen: list[tuple[str, str]] = []
    while time.monotonic() < until:
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["msg_type"] == "status":
            about = "cell" if msg["parent_header"].get("msg_id") == cell else "other"
            seen.append((msg["content"]["execution_state"], about))
        if msg["msg_type"] == "comm_msg" and "step 20" in str(msg["content"]):
            return seen  # the run is well under way: its widget shows step 20
    return seen


def test_the_kernel_stays_busy_while_a_cell_waits_on_a_run(kernel: Kernel) -> None:
    cell = kernel.client.execute(LONG_RUN)
    deadline = time.monotonic() + 90
    before = _statuses(kernel, cell, deadline)
    assert before == [("busy", "cell")], before
    # What the server's connection check sends (jupyter_server's nudge) on the control channel.
    kernel.client.control_channel.send(kernel.client.session.msg("kernel_info_request", {}))
    seen: list[tuple[str, str]] = []
    while ("idle", "cell") not in seen and time.monotonic() < deadline:
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["msg_type"] == "status":
            about = "cell" if msg["parent_header"].get("msg_id") == cell else "other"
            seen.append((msg["content"]["execution_state"], about))
    assert seen[-1] == ("idle", "cell"), seen
    # The status a frontend shows is the last one it got: busy until the cell is over.
    assert ("idle", "other") in seen, seen
    after_idle = seen[seen.index(("idle", "other")) + 1]
    assert after_idle == ("busy", "cell"), seen


ASYNC = """%%distributed --async --out h gpus=2 gpu_type=cpu --no-tracking
"forty-two"
"""
WAIT = "print(h.result(60)[0])"


def _html(cell: Any) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)


def test_an_async_records_result_names_its_value(tmp_path: Path) -> None:
    sources = ["%load_ext jupyter_ext", ASYNC, WAIT]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    record = _html(nb.cells[1])
    assert "sgpu-record" in record, nb.cells[1].outputs
    assert "str &#x27;forty-two&#x27;" in record, record
