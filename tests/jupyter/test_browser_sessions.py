"""JupyterLab in headless Chromium: a session cell's widget, its Cancel (the session lives on,
same processes), and ``%distributed_session restart`` (a fresh namespace)."""

from __future__ import annotations

import os
import re
from pathlib import Path

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
    "%distributed_session restart demo",
    "%%distributed --session demo\n'time' in globals()",
]


def _pids(text: str) -> list[int]:
    return sorted(int(p) for p in re.findall(r"Out\[\d+:\d\]: (\d+)", text))


def test_session_cell_cancel_and_restart_in_jupyterlab(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    shots, root = lab.lab_folder(tmp_path, NOTEBOOK, CELLS)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with lab_server(root, env, tmp_path / "lab.log") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            page.goto(server.page_url(NOTEBOOK))
            kernel = lab._kernel_process(server.process.pid)
            lab._wait_idle(page, 60)
            lab._dismiss_notifications(page)
            lab._run_cell(page, 0)
            lab._wait_idle(page, 30)

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
            lab._cell(page, 2).locator(".jp-Cell-outputWrapper").screenshot(
                path=str(shots / "session-cancelled.png")
            )
            lab._wait_idle(page, 20)

            lab._run_cell(page, 3)
            expect(lab._cell(page, 3).locator(".sgpu-record")).to_contain_text(
                "succeeded", timeout=30 * MS
            )
            assert _pids(lab._cell(page, 3).inner_text()) == pids  # the same processes

            lab._run_cell(page, 4)
            expect(lab._cell(page, 4)).to_contain_text("restarted", timeout=60 * MS)
            assert wait_for(lambda: not any(pid_alive(p) for p in pids), 10)
            lab._run_cell(page, 5)
            expect(lab._cell(page, 5)).to_contain_text(
                re.compile(r"Out\[\d+:1\]: False"), timeout=60 * MS
            )
        finally:
            browser.close()
    assert wait_for(lambda: not pid_alive(kernel.pid), 10)
