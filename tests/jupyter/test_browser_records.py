"""JupyterLab (dark theme) in headless Chromium: what a run's record keeps and the hang doctor
(issue 28 items 4 to 8).

A cancelled run's record says how far each rank's progress bar got; the all-ranks view shows
bars being drawn; the full log opens at its end, in the notebook's theme, and follows the run;
Stacks shows a busy state, one line per rank naming the cell, a verdict, tqdm's monitor thread
folded, all of it kept in the record with the hang warning (and in the saved notebook, reopened);
the kernel stays "Busy" while a second tab connects; rank labels, links and error headlines
read at 4.5:1 or more, measured from the rendered colours; the focus ring shows; buttons are
named without a blank. The saved records are reopened in JupyterLab and in Notebook 7.

Screenshots go to the test's temporary folder; ``scripts/refresh_screenshots.sh`` writes them to
``docs/`` instead.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import test_browser as lab
from jupyter_helpers import FAKE_MLFLOW_LINK, write_ipython_profile
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}"),
]
MS = 1000
NOTEBOOK = "records.ipynb"
MIN_CONTRAST = 4.5
CELLS = [
    "%load_ext jupyter_ext",
    # 1: ranks that only draw a progress bar, cancelled part way
    "%%distributed gpus=2 gpu_type=cpu\n"
    "import sys, time\n"
    "from tqdm import tqdm\n"
    "from serverless_gpu.runtime import get_global_rank\n"
    "\n"
    "for step in tqdm(range(600), desc='train', file=sys.stderr, mininterval=0.1, ncols=80):\n"
    "    time.sleep(0.05 * (1 + get_global_rank()))",
    # 2: a long log, then a slow one: the full log opens at its end and follows
    "%%distributed gpus=1 gpu_type=cpu\n"
    "import time\n"
    "for i in range(100_000):\n"
    "    print(f'line {i}', flush=True)\n"
    "    time.sleep(0.001 if i < 3000 else 0.1)",
    # 3: rank 0 waits in all_reduce for rank 1, which is stuck in a function of its own
    "import sys, time\n"
    "from serverless_gpu import distributed\n"
    "\n"
    "@distributed(gpus=2, gpu_type='cpu', standby=False, hang_warning=3)\n"
    "def one_rank_never_reduces():\n"
    "    import torch, torch.distributed as dist\n"
    "    from tqdm import tqdm\n"
    "    from serverless_gpu import runtime\n"
    "\n"
    "    def stuck_here():\n"
    "        time.sleep(600)\n"
    "\n"
    "    runtime.init_process_group()\n"
    "    tqdm(range(3), file=sys.stderr)\n"
    "    if runtime.get_global_rank() == 1:\n"
    "        stuck_here()\n"
    "    dist.all_reduce(torch.ones(1))\n"
    "\n"
    "one_rank_never_reduces.distributed()",
    # 4: rank 1 raises
    "%%distributed gpus=2 gpu_type=cpu\n"
    "from serverless_gpu.runtime import get_global_rank\n"
    "if get_global_rank() == 1:\n"
    "    raise ValueError('batch 7 has no labels')",
]
SETTINGS = {
    "@jupyterlab/apputils-extension/themes": {"theme": "JupyterLab Dark"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
}

# The contrast of an element's text with what is drawn behind it (WCAG 2), from the colours the
# browser rendered: the backgrounds of its ancestors composited, then its own colour over them.
CONTRAST_JS = """(el) => {
  if (!el.isConnected) return -1;  // replaced by a redraw: measure the new one
  const parse = (c) => {
    const m = c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => {
    const a = top[3] + bottom[3] * (1 - top[3]);
    return [0, 1, 2].map((i) => (top[i] * top[3] + bottom[i] * bottom[3] * (1 - top[3])) / a)
      .concat([a]);
  };
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const b = parse(getComputedStyle(e).backgroundColor);
    if (b[3] > 0) layers.push(b);
    if (b[3] >= 1) break;
  }
  let bg = [255, 255, 255, 1];
  for (const layer of layers.reverse()) bg = over(layer, bg);
  const fg = over(parse(getComputedStyle(el).color), bg);
  const lum = (c) => c.slice(0, 3).map((v) => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  }).reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
  return (hi + 0.05) / (lo + 0.05);
}"""
# Records whether an element matching the selector ever appeared under the element.
WATCH_JS = """(el, selector) => {
  el.dataset.sawBusy = "false";
  new MutationObserver(() => {
    if (el.querySelector(selector)) el.dataset.sawBusy = "true";
  }).observe(el, { subtree: true, childList: true, characterData: true });
}"""


def test_records_and_the_hang_doctor_in_jupyterlab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import sync_playwright

    shots, root = lab.lab_folder(tmp_path, NOTEBOOK, CELLS)
    for name, value in SETTINGS.items():
        path = tmp_path / "settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(tmp_path / "settings"))
    monkeypatch.setenv("JUPYTERLAB_WORKSPACES_DIR", str(tmp_path / "workspaces"))
    monkeypatch.setenv("IPYTHONDIR", str(write_ipython_profile(tmp_path / "ipy", FAKE_MLFLOW_LINK)))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with (
        lab_server(root, dict(os.environ), tmp_path / "lab.log") as server,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 1100})
            page = context.new_page()  # a context of its own: a second tab opens in it
            page.goto(server.page_url(NOTEBOOK))
            lab._wait_idle(page, 60)
            lab._dismiss_notifications(page)
            _select_kernel(page)
            assert page.evaluate("document.body.dataset.jpThemeLight") == "false"
            lab._run_cell(page, 0)
            _cancelled_progress(page, shots, server.page_url(NOTEBOOK))
            _full_log_follows(page)
            _stacks_doctor(page, shots)
            _error_headline(page)
            _saved_and_reopened(page)
            _reopened_in_notebook7(context, server.notebook7_url(NOTEBOOK))
        except Exception:
            page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
            print("screenshot of the failure:", tmp_path / "failed.png")
            raise
        finally:
            browser.close()


def _select_kernel(page: Any) -> None:
    """Answer JupyterLab's "Select Kernel" (asked in a fresh settings folder) with Python 3.
    No question comes once the toolbar names the notebook's kernel (started or starting)."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    named = page.locator(".jp-KernelName", has_text="Python 3 (ipykernel)")
    try:
        dialog.or_(named).first.wait_for(timeout=10 * MS)
    except Exception:  # playwright's TimeoutError: neither, so no question asked
        return
    if not dialog.is_visible():
        return
    dialog.locator("select").select_option(label="Python 3 (ipykernel)")
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    expect_kernel = page.locator("#jp-main-statusbar", has_text="Python 3 (ipykernel) | Idle")
    expect_kernel.wait_for(timeout=60 * MS)


def _contrast(locator: Any) -> float:
    measured: list[float] = []

    def measure() -> bool:
        measured.append(float(locator.evaluate(CONTRAST_JS)))
        return measured[-1] > 0  # not an element a redraw had just replaced

    lab.wait_for(measure, 5)
    return measured[-1]


def _cancelled_progress(page: Any, shots: Path, url: str) -> None:
    """Item 4 (and 8: bars in the all-ranks view; 7: busy while another tab connects; 6)."""
    from playwright.sync_api import expect

    lab._run_cell(page, 1)
    cell = lab._cell(page, 1)
    run = cell.locator(".sgpu-run")
    merged = run.locator('.sgpu-rank-output[data-rank="all"]')
    expect(merged).to_contain_text(re.compile(r"\[rank 1\] train: +\d+%\|"), timeout=60 * MS)
    expect(merged).not_to_contain_text("(no output yet)")
    expect(run.locator(".sgpu-live[aria-live=polite]")).to_have_text(re.compile("running$"))
    for label in run.locator(".sgpu-rank-label").all()[:2]:
        assert _contrast(label) >= MIN_CONTRAST, (
            label.inner_text(),
            label.evaluate("e => [getComputedStyle(e).color, e.outerHTML]"),
        )
    link = run.locator(".sgpu-header a", has_text="MLflow run")
    assert _contrast(link) >= MIN_CONTRAST
    # JupyterLab asked for a subshell when the widget showed (a control request, then "idle"):
    # the status bar still says the kernel is busy.
    busy = '.jp-Notebook-ExecutionIndicator[data-status="busy"]'
    expect(page.locator(busy)).to_be_visible()
    expect(page.locator("#jp-main-statusbar")).to_contain_text("| Busy")
    # Another tab on the same notebook: the server checks its new connection with a control
    # request, whose reply used to turn the kernel's status to "idle" mid-run.
    second = page.context.new_page()
    second.goto(url)
    lab._dismiss_notifications(second)
    expect(second.locator(busy)).to_be_visible(timeout=60 * MS)
    expect(page.locator(busy)).to_be_visible()
    second.close()
    header = run.locator(".sgpu-header")
    bar_moved = re.compile(r"progress: .*rank 1 at ([2-9]|\d\d)%")
    expect(header).to_contain_text(bar_moved, timeout=60 * MS)
    run.get_by_role("button", name="Cancel", exact=True).click()
    record = cell.locator(".sgpu-record")
    expect(record).to_contain_text("was cancelled", timeout=20 * MS)
    text = record.inner_text()
    for rank in (0, 1):
        assert re.search(rf"\n{rank}\s+cancelled\s.*cancelled at \d+ % · \d+/600", text), text
    assert "progress when it ended: slowest rank 1 at" in text, text
    assert "(no output)" not in text and "last 0 lines" not in text, text
    tail = record.locator('details[data-rank="0"] pre')
    expect(tail).to_contain_text(re.compile(r"train: +\d+%\|.*\| \d+/600"))
    error = cell.locator('[data-mime-type="application/vnd.jupyter.stderr"] pre span').first
    expect(error).to_have_text(re.compile("^CancelledError: run cancelled"), timeout=10 * MS)
    assert _contrast(error) >= MIN_CONTRAST
    lab._wait_idle(page, 20)
    cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(shots / "record-cancelled.png"))


def _full_log_follows(page: Any) -> None:
    """Item 8: the full log opens at its end, themed, and keeps up with the run."""
    from playwright.sync_api import expect

    lab._run_cell(page, 2)
    run = lab._cell(page, 2).locator(".sgpu-run")
    run.locator(".lm-TabBar-tab", has_text="rank 0").click()
    pane = run.locator('.sgpu-rank-output[data-rank="0"]')
    expect(pane).to_contain_text("line 3001", timeout=90 * MS)
    with page.context.expect_page(timeout=20 * MS) as opened:
        run.get_by_role("button", name="open full log").first.click()
    log = opened.value
    expect(log.locator("pre")).to_contain_text("line 0\nline 1\n", timeout=20 * MS)
    assert log.url.startswith("blob:"), log.url
    # The dark theme's background (--jp-layout-color0), not a blank white page.
    assert log.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(17, 17, 17)"
    assert lab.wait_for(
        lambda: (
            log.evaluate("scrollY + innerHeight >= document.documentElement.scrollHeight - 8")
            and log.evaluate("scrollY") > 0
        ),
        10,
    ), "the log did not open at its end"
    newest = max(int(n) for n in re.findall(r"line (\d+)", log.locator("pre").inner_text()))
    assert lab.wait_for(lambda: f"line {newest + 5}" in log.locator("pre").inner_text(), 20), (
        "the log page did not follow the run"
    )
    log.close()
    run.get_by_role("button", name="Cancel", exact=True).click()
    record = lab._cell(page, 2).locator(".sgpu-record")
    expect(record).to_contain_text("was cancelled", timeout=20 * MS)
    lab._wait_idle(page, 20)


def _stacks_doctor(page: Any, shots: Path) -> None:
    """Item 5 (and 6: a visible focus ring, buttons named without a blank)."""
    from playwright.sync_api import expect

    lab._run_cell(page, 3)
    cell = lab._cell(page, 3)
    run = cell.locator(".sgpu-run")
    expect(run.locator(".sgpu-hang")).to_contain_text("silent for 3 s", timeout=90 * MS)
    stacks = run.get_by_role("button", name="Stacks", exact=True)
    cancel = run.get_by_role("button", name="Cancel", exact=True)
    cancel.focus()
    page.keyboard.press("Shift+Tab")
    assert stacks.evaluate("e => e.matches(':focus-visible')")
    ring = stacks.evaluate(
        "e => [getComputedStyle(e).outlineStyle, getComputedStyle(e).outlineWidth]"
    )
    assert ring == ["solid", "2px"], ring
    run.evaluate(WATCH_JS, ".sgpu-busy")
    stacks.click()
    lines = run.locator(".sgpu-stack-line")
    expect(lines).to_have_count(2, timeout=20 * MS)
    assert run.evaluate("e => e.dataset.sawBusy") == "true"  # the busy state was shown
    expect(lines.nth(0)).to_have_text(
        re.compile(r"^rank 0 · in all_reduce ← Cell In\[\d+\], line 17")
    )
    expect(lines.nth(1)).to_have_text(
        re.compile(r"^rank 1 · in stuck_here ← Cell In\[\d+\], line 11")
    )
    verdict = run.locator(".sgpu-verdict")
    expect(verdict).to_contain_text("rank 1 never entered the collective that rank 0 waits in")
    expect(run.locator(".sgpu-live")).to_contain_text("stacks taken: rank 1 never entered")
    run.screenshot(path=str(shots / "widget-stacks-verdict.png"))
    run.locator(".lm-TabBar-tab", has_text="rank 1").click()
    folded = run.locator('.sgpu-stacks[data-rank="1"] .sgpu-library-threads summary')
    expect(folded).to_contain_text("tqdm")
    assert "2623648678" not in run.locator('.sgpu-stacks[data-rank="1"] > pre').inner_text()
    cancel.click()
    record = cell.locator(".sgpu-record")
    expect(record).to_contain_text("was cancelled", timeout=30 * MS)
    expect(record.locator(".sgpu-hang")).to_contain_text("during the run:")
    expect(record.locator(".sgpu-verdict")).to_contain_text("rank 1 never entered")
    expect(record.locator(".sgpu-stack-line")).to_have_count(2)
    lab._wait_idle(page, 20)
    cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(shots / "record-stacks.png"))


def _error_headline(page: Any) -> None:
    """Items 6 and 8: the error's headline reads in the dark theme; the record does not repeat
    the traceback the notebook shows under it."""
    from playwright.sync_api import expect

    lab._run_cell(page, 4)
    cell = lab._cell(page, 4)
    error = cell.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(error).to_contain_text("rank 1 raised ValueError", timeout=90 * MS)
    headline = error.locator("pre span", has_text="rank 1 raised ValueError").first
    assert _contrast(headline) >= MIN_CONTRAST
    tail = cell.locator('.sgpu-record details[data-rank="1"]')
    expect(tail).to_contain_text("its traceback is shown under this record")
    expect(tail).not_to_contain_text("Traceback (most recent call last)")
    assert error.inner_text().count("batch 7 has no labels") >= 1
    lab._wait_idle(page, 20)


def _saved_and_reopened(page: Any) -> None:
    """The records are what the saved notebook keeps: reopened, they read as they ended."""
    from playwright.sync_api import expect

    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=10 * MS)
    page.reload()
    lab._wait_idle(page, 60)
    cancelled = lab._cell(page, 1).locator(".sgpu-record")
    expect(cancelled).to_contain_text(re.compile(r"cancelled at \d+ % · \d+/600"), timeout=30 * MS)
    expect(cancelled).to_contain_text("progress when it ended")
    stacks = lab._cell(page, 3).locator(".sgpu-record")
    expect(stacks.locator(".sgpu-verdict")).to_contain_text("rank 1 never entered")
    expect(stacks.locator(".sgpu-hang")).to_contain_text("during the run:")


def _reopened_in_notebook7(context: Any, url: str) -> None:
    """The saved notebook opened in Notebook 7: the same records, no widget left to miss."""
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(url)
    cancelled = lab._cell(page, 1).locator(".sgpu-record")
    expect(cancelled).to_contain_text(re.compile(r"cancelled at \d+ % · \d+/600"), timeout=60 * MS)
    expect(cancelled).to_contain_text("progress when it ended")
    stacks = lab._cell(page, 3).locator(".sgpu-record")
    expect(stacks.locator(".sgpu-verdict")).to_contain_text("rank 1 never entered")
    expect(page.get_by_text("Error displaying widget")).to_have_count(0)
    page.close()
