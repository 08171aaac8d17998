"""JupyterLab and Notebook 7 in headless Chromium: a session cell's widget, its Cancel (the
session lives on, same processes), a quick cell that reads as ``%%px`` does (at most 4 lines),
a failing cell's full record, and ``%distributed_session restart`` (a fresh namespace, one line).

Screenshots go to the test's temporary folder; ``scripts/refresh_screenshots.sh`` writes them to
``docs/`` instead."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import test_browser as lab
from jupyter_helpers import pid_alive, wait_for
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}"),
]
MS = 1000
NOTEBOOK = "sessions.ipynb"
CELLS = [
    "%load_ext jupyter_ext",
    "%%distributed --session demo gpus=2 gpu_type=cpu --no-tracking\n"
    "import os, time\n"
    "print(f'rank {os.environ[\"RANK\"]} ready', flush=True)\n"
    "os.getpid()",
    "%%distributed --session demo\nprint('sleeping', flush=True)\ntime.sleep(120)",
    "%%distributed --session demo\nos.getpid()",
    "%%distributed --session demo\nraise ValueError('bad value')",
    "%distributed_session restart demo",
    "%%distributed --session demo\n'time' in globals()",
]


def _pids(text: str) -> list[int]:
    return sorted(int(p) for p in re.findall(r"Out\[\d+:\d\]: (\d+)", text))


def _ran(page: Any, index: int, seconds: float) -> None:
    """Until cell ``index`` has run (its prompt shows a number, not ``*``)."""
    from playwright.sync_api import expect

    prompt = lab._cell(page, index).locator(".jp-InputPrompt")
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=seconds * MS)


def _shot(page: Any, index: int, path: Path) -> None:
    lab._cell(page, index).locator(".jp-Cell-outputWrapper").screenshot(path=str(path))


@pytest.mark.parametrize("frontend", ["lab", "notebook7"])
def test_session_cells_in_the_browser(tmp_path: Path, frontend: str) -> None:
    from playwright.sync_api import sync_playwright

    shots, root = lab.lab_folder(tmp_path, NOTEBOOK, CELLS)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with lab_server(root, env, tmp_path / "lab.log") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            lab_page = frontend == "lab"
            page.goto(server.page_url(NOTEBOOK) if lab_page else server.notebook7_url(NOTEBOOK))
            kernel = lab._kernel_process(server.process.pid)
            # Notebook 7 too: a Shift+Enter before its kernel is connected runs nothing
            lab._wait_idle(page, 60)
            if lab_page:
                lab._dismiss_notifications(page)
            lab._run_when_connected(page, 0)  # %load_ext
            _ran(page, 0, 60)
            _drive(page, shots / f"session-{frontend}")
        finally:
            browser.close()
    assert wait_for(lambda: not pid_alive(kernel.pid), 10)


def _drive(page: Any, shots: Path) -> None:
    from playwright.sync_api import expect

    lab._run_cell(page, 1)
    first = lab._cell(page, 1)
    expect(first.locator(".sgpu-record")).to_contain_text("demo In[2]", timeout=90 * MS)
    expect(first.locator(".sgpu-record")).to_contain_text("rank 1 ready")
    expect(first).to_contain_text("Out[")
    pids = _pids(first.inner_text())
    assert len(pids) == 2, first.inner_text()

    lab._run_cell(page, 2)
    run = lab._cell(page, 2).locator(".sgpu-run")
    expect(run.locator(".sgpu-header")).to_contain_text("running", timeout=30 * MS)
    expect(run).to_contain_text("sleeping", timeout=30 * MS)
    run.get_by_role("button", name="Cancel").click()
    record = lab._cell(page, 2).locator(".sgpu-record")
    expect(record).to_contain_text("was cancelled", timeout=10 * MS)
    error = lab._cell(page, 2).locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(error).to_contain_text("CancelledError", timeout=10 * MS)
    _ran(page, 2, 20)
    _shot(page, 2, shots.with_name(shots.name + "-cancelled.png"))

    _quick_cell(page, pids, shots)

    lab._run_cell(page, 4)
    failed = lab._cell(page, 4)
    expect(failed.locator(".sgpu-record-rank").first).to_be_attached(timeout=30 * MS)
    expect(failed).to_contain_text("bad value")
    _ran(page, 4, 20)
    _shot(page, 4, shots.with_name(shots.name + "-failed.png"))

    lab._run_cell(page, 5)
    restarted = lab._cell(page, 5)
    expect(restarted).to_contain_text("restarted", timeout=60 * MS)
    _ran(page, 5, 30)
    lines = restarted.locator(".jp-OutputArea").inner_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), 10)
    _shot(page, 5, shots.with_name(shots.name + "-restart.png"))
    lab._run_cell(page, 6)
    expect(lab._cell(page, 6)).to_contain_text(re.compile(r"Out\[\d+:1\]: False"), timeout=60 * MS)


def _quick_cell(page: Any, pids: list[int], shots: Path) -> None:
    """A quick cell: its values and one status line, the rank table folded under it."""
    from playwright.sync_api import expect

    lab._run_cell(page, 3)
    quick = lab._cell(page, 3)
    expect(quick.locator(".sgpu-record-folded")).to_contain_text("succeeded", timeout=30 * MS)
    _ran(page, 3, 20)
    assert _pids(quick.inner_text()) == pids  # the same processes
    lines = [x for x in quick.locator(".jp-OutputArea").inner_text().splitlines() if x.strip()]
    assert len(lines) <= 4, lines
    expect(quick.locator(".sgpu-record-rank").first).not_to_be_visible()  # one click away
    _shot(page, 3, shots.with_name(shots.name + "-quick.png"))
