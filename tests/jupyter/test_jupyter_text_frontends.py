"""A frontend that draws no widgets (here a ``jupyter_client`` driver) sees the ranks' lines
while a call or a session cell runs, as text, as ``%%px`` shows them. The display that carries
them is a hidden widget view for a page that draws widgets, and holds nothing once the run ends:
the record is the cell's last word."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest
import test_browser as lab
from jupyter_helpers import Kernel, write_ipython_profile
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server
from test_browser_records import _select_kernel
from test_browser_sessions import _ran

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


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}")
@pytest.mark.parametrize("frontend", ["lab", "notebook7"])
def test_a_page_that_draws_the_widget_shows_the_lines_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frontend: str
) -> None:
    from playwright.sync_api import sync_playwright

    go = tmp_path / "go"
    cells = [
        "%load_ext jupyter_ext",
        "%%distributed gpus=2 gpu_type=cpu\n" + _body(go),
        SESSION + "1",
        "%%distributed --session s\n" + _body(go.with_name("go2")),
    ]
    _shots, root = lab.lab_folder(tmp_path, "text.ipynb", cells)
    monkeypatch.setenv("IPYTHONDIR", str(write_ipython_profile(tmp_path / "ipy")))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with lab_server(root, env, tmp_path / "lab.log") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            lab_page = frontend == "lab"
            page.goto(
                server.page_url("text.ipynb") if lab_page else server.notebook7_url("text.ipynb")
            )
            lab._wait_idle(page, 60)  # Notebook 7 too (a run before the kernel is connected)
            if lab_page:
                lab._dismiss_notifications(page)
            _select_kernel(page)
            lab._run_when_connected(page, 0)
            _ran(page, 0, 60)
            _lines_once(page, 1, go)
            lab._run_cell(page, 2)
            _ran(page, 2, 120)
            _lines_once(page, 3, go.with_name("go2"))
        except Exception:
            page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
            print("screenshot of the failure:", tmp_path / "failed.png")
            raise
        finally:
            browser.close()


def _rows(page: Any, index: int) -> list[tuple[float, str]]:
    """Each output row of cell ``index``: its height and its text."""
    rows = lab._cell(page, index).locator(".jp-OutputArea-child")
    return [
        (rows.nth(i).bounding_box()["height"], rows.nth(i).inner_text())
        for i in range(rows.count())
    ]


def _lines_once(page: Any, index: int, go: Path) -> None:
    """While the cell runs its lines show once (in the widget; the text display's row is
    empty, no height), and once it ended no row is left empty: the record holds them."""
    from playwright.sync_api import expect

    lab._run_cell(page, index)
    cell = lab._cell(page, index)
    expect(cell.locator(".sgpu-run")).to_contain_text("first line of rank 1", timeout=90 * lab.MS)
    expect(cell.locator(".jp-OutputArea-child")).to_have_count(2, timeout=10 * lab.MS)
    (_, widget), (height, text) = _rows(page, index)
    assert "first line of rank 0" in widget and (height, text) == (0, ""), _rows(page, index)
    go.touch()
    expect(cell.locator(".sgpu-record")).to_contain_text(
        "second line of rank 1", timeout=60 * lab.MS
    )
    expect(cell.locator(".sgpu-run")).to_have_count(0)
    rows = _rows(page, index)
    assert all(height > 0 and text.strip() for height, text in rows), rows
    assert [text for _, text in rows if "first line of rank 0" in text] == [rows[0][1]], rows
