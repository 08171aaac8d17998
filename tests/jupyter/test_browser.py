"""JupyterLab in headless Chromium: the live widget, a tqdm bar on one line, Cancel that works."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_helpers import (
    FAKE_MLFLOW_LINK,
    NOTEBOOKS,
    REPO,
    descendants,
    pid_alive,
    wait_for,
    wait_gone,
    write_ipython_profile,
)
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}"),
]
SCREENSHOT = REPO / "docs" / "widget.png"
MS = 1000


def _run_cell(page: Any, tag_index: int) -> None:
    """Select the notebook's cell ``tag_index`` (0-based) and run it with Shift+Enter."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(tag_index)
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def _kernel_process(server_pid: int, timeout: float = 60) -> psutil.Process:
    """The kernel the server started for the notebook."""
    found: list[psutil.Process] = []

    def started() -> bool:
        children = psutil.Process(server_pid).children()
        found[:] = [p for p in children if "ipykernel" in _cmdline(p)]
        return len(found) == 1

    assert wait_for(started, timeout), "no kernel started"
    return found[0]


def test_widget_in_jupyterlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.sync_api import expect, sync_playwright

    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(NOTEBOOKS / "widget_demo.ipynb", root)
    # The link the tracking hook would add (a real MLflow store is slow to create here).
    monkeypatch.setenv("IPYTHONDIR", str(write_ipython_profile(tmp_path / "ipy", FAKE_MLFLOW_LINK)))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    env = dict(os.environ)
    with lab_server(root, env, tmp_path / "lab.log") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1250})
            page.goto(server.page_url("widget_demo.ipynb"))
            kernel = _kernel_process(server.process.pid)
            idle = page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
            expect(idle).to_be_visible(timeout=60 * MS)
            assert Path(kernel.exe()).resolve() == Path(sys.executable).resolve()

            _run_cell(page, 1)  # %load_ext jupyter_ext
            _run_cell(page, 2)  # the short %%distributed cell
            first = page.locator(".sgpu-run").first
            expect(first.locator(".sgpu-summary")).to_contain_text("succeeded", timeout=90 * MS)
            _check_finished_widget(first)

            _run_cell(page, 3)  # the long cell
            second = page.locator(".sgpu-run").nth(1)
            output = second.locator('.sgpu-rank-output[data-rank="0"]')
            expect(output).to_contain_text("rank 0 step 3", timeout=60 * MS)  # live, mid-cell
            ranks = [p for p in descendants(kernel.pid) if p.ppid() != kernel.pid]
            assert len(ranks) == 2, ranks
            _screenshot(page)

            second.get_by_role("button", name="Cancel").click()
            assert not wait_gone(ranks, 3), "ranks still alive 3 s after Cancel"
            summary = second.locator(".sgpu-summary")
            expect(summary).to_contain_text("was cancelled", timeout=10 * MS)
            error = page.locator(".jp-Cell").nth(3).locator(".jp-OutputArea-output").last
            expect(error).to_contain_text("CancelledError", timeout=10 * MS)
            expect(idle).to_be_visible(timeout=10 * MS)
        finally:
            browser.close()
    assert wait_for(lambda: not pid_alive(kernel.pid), 10)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie the server has not reaped yet
        return ""


def _screenshot(page: Any) -> None:
    """Both widgets in view: the finished short run above, the live long run below."""
    news = page.get_by_role("button", name="No")
    if news.count():
        news.first.click()
    page.keyboard.press("Escape")
    page.locator(".jp-Notebook .jp-Cell").nth(2).evaluate("e => e.scrollIntoView({block: 'start'})")
    page.locator(".jp-Notebook").screenshot(path=str(SCREENSHOT))


def _check_finished_widget(widget: Any) -> None:
    from playwright.sync_api import expect

    tabs = widget.locator(".lm-TabBar-tab")
    expect(tabs).to_have_count(2)
    expect(tabs.nth(0)).to_have_text(re.compile(r"rank 0 · done"))
    link = widget.get_by_role("link", name=re.compile("MLflow run"))
    expect(link).to_have_attribute(
        "href", re.compile(r"^http://127\.0\.0\.1:5000/#/experiments/0/runs/")
    )
    for rank in (0, 1):
        tabs.nth(rank).click()
        output = widget.locator(f'.sgpu-rank-output[data-rank="{rank}"]')
        expect(output).to_contain_text(f"rank {rank}: finished, loss")
        text = output.inner_text()
        bars = [line for line in text.splitlines() if f"rank {rank} training:" in line]
        assert len(bars) == 1 and "30/30" in bars[0], text  # tqdm redraws one line
        assert f"rank {1 - rank}:" not in text
        colored = output.locator('span[style*="color"]', has_text=f"rank {rank}")
        expect(colored.first).to_be_visible()  # ANSI colours became HTML
    tabs.nth(0).click()
