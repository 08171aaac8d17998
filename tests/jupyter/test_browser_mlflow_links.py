"""MLflow links in JupyterLab, in headless Chromium: a tracked run's widget starts the UI by
itself and shows one link, the record of a short run links the live UI, the link opens the
run's page in MLflow 3's "Model training" view (not GenAI > Evaluations), and the saved record
keeps the link (no local store path); serving the store again makes the saved link open.

Screenshots go to the test's temporary folder (``SERVERLESS_GPU_SCREENSHOTS`` names another).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from jupyter_helpers import pid_alive, wait_for
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server
from test_browser import (
    MS,
    _cell,
    _dismiss_notifications,
    _kernel_process,
    _run_cell,
    _wait_idle,
    lab_folder,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}"),
]
NOTEBOOK = "mlflow_links.ipynb"
CELLS = [
    "%load_ext jupyter_ext",
    # 1: a short tracked run (seconds, as a quick experiment is)
    "%%distributed gpus=1 gpu_type=cpu\nimport time\nprint('training for a moment')\ntime.sleep(6)",
    # 2: (after a kernel restart) serve the store again, as the record says
    "from serverless_gpu.tracking import ui\nui()",
]
MLFLOW_LINK = 'a[data-link="mlflow"]'


def test_mlflow_links_in_jupyterlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.sync_api import sync_playwright

    shots, root = lab_folder(tmp_path, NOTEBOOK, CELLS)
    profile = tmp_path / "ipy" / "profile_default"  # unlike other test kernels: tracking on
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.HistoryManager.enabled = False\n")
    monkeypatch.setenv("IPYTHONDIR", str(profile.parent))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    with (
        lab_server(root, dict(os.environ), tmp_path / "lab.log") as server,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            page.goto(server.page_url(NOTEBOOK))
            kernel = _kernel_process(server.process.pid)
            _wait_idle(page, 60)
            _dismiss_notifications(page)
            _run_cell(page, 0)
            link = _short_run_links_the_live_ui(page, shots)
            _link_opens_the_runs_page(page, link, shots)
            _saved_record_after_restart(page, link, shots)
            _saved_record_in_notebook7(browser, server.notebook7_url(NOTEBOOK), link)
        finally:
            browser.close()
    assert wait_for(lambda: not pid_alive(kernel.pid), 10)


def _short_run_links_the_live_ui(page: Any, shots: Path) -> str:
    from playwright.sync_api import expect

    _run_cell(page, 1)
    cell = _cell(page, 1)
    run = cell.locator(".sgpu-run")
    header = run.locator(".sgpu-header")
    # Nothing to press: no "Open in MLflow" button, one MLflow entry in the header (a link
    # once the UI answers, until then what it waits for).
    merged = run.locator('.sgpu-rank-output[data-rank="all"]')
    expect(merged).to_contain_text("training for a moment", timeout=60 * MS)
    expect(header.locator('[data-link="mlflow"]')).to_have_count(1)
    expect(cell.get_by_role("button", name=re.compile("MLflow"))).to_have_count(0)
    run.screenshot(path=str(shots / "mlflow-live-header.png"))
    record = cell.locator(".sgpu-record")
    expect(record).to_contain_text("run succeeded", timeout=90 * MS)
    # The run ended within seconds; its record links the UI's address (known before it answers).
    expect(record.locator(MLFLOW_LINK)).to_have_count(1, timeout=150 * MS)
    expect(record.locator(".sgpu-link-pending")).to_have_count(0)
    link = record.locator(MLFLOW_LINK).get_attribute("href")
    assert link is not None
    assert re.match(r"^http://127\.0\.0\.1:\d+/#/experiments/\d+/runs/\w+", link), link
    expect(cell.locator("a", has_text=re.compile("MLflow"))).to_have_count(1)  # no second link
    # A link that opens needs no help, and a shared notebook carries no local store path.
    expect(record.locator(".sgpu-mlflow-hint")).to_have_count(0)
    expect(record).not_to_contain_text("sqlite:///")
    cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(shots / "mlflow-record.png"))
    return link


def _link_opens_the_runs_page(page: Any, link: str, shots: Path) -> None:
    """Clicked as a user does: a new tab with the run in MLflow's "Model training" view (once
    the UI answers: the record links its address from the run's end, while it may start)."""
    from playwright.sync_api import expect

    assert wait_for(lambda: _answers(link.split("/#/")[0] + "/health"), 150)

    with page.context.expect_page(timeout=20 * MS) as opened:
        _cell(page, 1).locator(f".sgpu-record {MLFLOW_LINK}").click()
    mlflow = opened.value
    assert mlflow.url == link
    breadcrumb = mlflow.get_by_role("link", name="Runs", exact=True)
    expect(breadcrumb.first).to_be_visible(timeout=60 * MS)
    expect(mlflow.get_by_role("tab", name="Overview")).to_be_visible()
    run_id = link.split("/runs/")[1].split("?")[0]
    expect(mlflow.get_by_text(run_id).first).to_be_visible()
    expect(mlflow.get_by_role("link", name="Evaluations")).to_have_count(0)
    mlflow.screenshot(path=str(shots / "mlflow-run-page.png"))
    mlflow.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _saved_record_after_restart(page: Any, link: str, shots: Path) -> None:
    """The kernel restarted: its UI is gone; the record keeps the link; ``ui()`` serves the
    store again at the same address."""
    from playwright.sync_api import expect

    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=10 * MS)
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel…$")).click()
    page.locator(".jp-Dialog-button.jp-mod-accept").click()
    _wait_idle(page, 60)
    page.reload()
    _wait_idle(page, 60)
    record = _cell(page, 1).locator(".sgpu-record")
    expect(record.locator(MLFLOW_LINK)).to_have_attribute("href", link, timeout=30 * MS)
    _run_cell(page, 2)
    address = link.split("/#/")[0]
    expect(_cell(page, 2).locator(".jp-OutputArea-output")).to_contain_text(
        address, timeout=150 * MS
    )
    with page.context.expect_page(timeout=20 * MS) as opened:
        record.locator(MLFLOW_LINK).click()
    mlflow = opened.value
    expect(mlflow.get_by_role("link", name="Runs", exact=True).first).to_be_visible(timeout=60 * MS)
    mlflow.close()
    _cell(page, 1).locator(".jp-Cell-outputWrapper").screenshot(
        path=str(shots / "mlflow-record-after-restart.png")
    )


def _saved_record_in_notebook7(browser: Any, url: str, link: str) -> None:
    """The saved record opened in Notebook 7 keeps its link, and no local store path."""
    from playwright.sync_api import expect

    nb7 = browser.new_page(viewport={"width": 1200, "height": 1000})
    nb7.goto(url)
    record = _cell(nb7, 1).locator(".sgpu-record")
    expect(record.locator(MLFLOW_LINK)).to_have_attribute("href", link, timeout=60 * MS)
    expect(record.locator(".sgpu-mlflow-hint")).to_have_count(0)
    expect(nb7.get_by_text("Error displaying widget")).to_have_count(0)
    nb7.close()
