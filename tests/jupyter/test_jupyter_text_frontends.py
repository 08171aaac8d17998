"""A frontend that draws no widgets (here a ``jupyter_client`` driver) sees the ranks' lines
while a call or a session cell runs, as text, as ``%%px`` shows them. The display that carries
them is a hidden widget view for a page that draws widgets, and holds nothing once the run ends:
the record is the cell's last word."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_helpers import Kernel

from jupyter_ext.live_text import NO_WIDGET, WIDGET_VIEW

pytestmark = pytest.mark.timeout(180)

SESSION = "%%distributed --session s gpus=2 gpu_type=cpu --no-tracking\n"
FIRST = ("[rank 0] first line of rank 0", "[rank 1] first line of rank 1")


def _body(go: Path) -> str:
    """Each rank prints a line, waits (bounded) for ``go`` to exist, then prints another."""
    return (
        "import os, time\n"
        "r = os.environ['RANK']\n"
        "print(f'first line of rank {r}', flush=True)\n"
        "deadline = time.monotonic() + 150\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(f'second line of rank {r}', flush=True)\n"
    )


class Cell:
    """One execute request's display messages (display and update bundles, in order)."""

    def __init__(self, kernel: Kernel, code: str) -> None:
        self.kernel = kernel
        self.msg_id = kernel.client.execute(code)
        self.displays: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.done = False

    def read_until(self, condition: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                msg = self.kernel.client.get_iopub_msg(timeout=min(0.2, remaining))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == self.msg_id:
                self._record(msg["msg_type"], msg["content"])
        return True

    def _record(self, kind: str, content: dict[str, Any]) -> None:
        if kind in ("display_data", "update_display_data"):
            self.displays.append(content["data"])
        elif kind == "error":
            self.errors.append("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            self.done = True

    def live(self) -> list[dict[str, Any]]:
        """The bundles that carry the ranks' lines as they come (the hidden widget view)."""
        return [d for d in self.displays if d.get(WIDGET_VIEW) == NO_WIDGET]

    def live_text(self) -> str:
        return "\n".join(d["text/plain"] for d in self.live())


def _check_live_lines(kernel: Kernel, code: str, go: Path) -> Cell:
    cell = Cell(kernel, code)
    # The ranks wait for `go` far longer than this: lines seen now were seen while they ran.
    seen = cell.read_until(lambda: all(w in cell.live_text() for w in FIRST), 60)
    assert seen and not cell.done, (cell.displays, cell.errors)
    assert "second line" not in cell.live_text()
    for bundle in cell.live():  # text for a text client, a hidden view for a widget page
        assert set(bundle) == {WIDGET_VIEW, "text/plain"}, bundle
    go.touch()
    assert cell.read_until(lambda: cell.done, 60), cell.displays
    assert not cell.errors, cell.errors
    # The live display ends empty (no text, no HTML: nothing a reader takes for the record),
    # and the record, which holds the last lines, comes after it.
    emptied = cell.displays.index({})
    records = [i for i, d in enumerate(cell.displays) if "second line of rank 1" in str(d)]
    assert records and records[-1] > emptied, cell.displays
    assert not [d for d in cell.displays[emptied:] if d.get(WIDGET_VIEW) == NO_WIDGET]
    return cell


def test_a_calls_lines_reach_a_client_without_widgets(kernel: Kernel, tmp_path: Path) -> None:
    _check_live_lines(
        kernel, "%%distributed gpus=2 gpu_type=cpu\n" + _body(tmp_path / "go"), tmp_path / "go"
    )


def test_a_session_cells_lines_reach_a_client_without_widgets(
    kernel: Kernel, tmp_path: Path
) -> None:
    started = kernel.run(SESSION + "1")
    assert not started.errors, started.all_text
    go = tmp_path / "go"
    _check_live_lines(kernel, "%%distributed --session s\n" + _body(go), go)
    assert kernel.run("%distributed_session stop s").done
