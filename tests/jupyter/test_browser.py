"""JupyterLab in headless Chromium, driven as a user would: the widget from the first moment of
a run to the record it leaves, panes that follow their output, the all-ranks view, Cancel, a
rank's error, and a kernel restart with a page reload.

Screenshots go to the test's temporary folder; ``scripts/refresh_screenshots.sh`` runs this
test with ``SERVERLESS_GPU_SCREENSHOTS`` set to ``docs/`` to refresh the documentation's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from jupyter_helpers import descendants, pid_alive, wait_for, wait_gone, write_ipython_profile
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}"),
]
SCREENSHOTS_ENV = "SERVERLESS_GPU_SCREENSHOTS"
MS = 1000
NOTEBOOK = "run_widget.ipynb"
# Stands in for the tracking hook (order 10): a link, after as long as creating an MLflow run
# takes, so that the widget's "starting" state is on screen for a while.
SLOW_TRACKING = (
    "import time as _time; _h.register_hook(lambda ctx: (_time.sleep(2), "
    "ctx.links.__setitem__('mlflow', 'http://127.0.0.1:5000/#/experiments/0/runs/' + "
    "ctx.run_id)) and None, order=10)"
)
CELLS = [
    "%load_ext jupyter_ext",
    # 1: short, coloured, with a progress bar
    "%%distributed gpus=2 gpu_type=cpu\n"
    "import time\n"
    "from tqdm import tqdm\n"
    "from serverless_gpu.runtime import get_global_rank\n"
    "\n"
    "rank = get_global_rank()\n"
    'print(f"\\x1b[1;32mrank {rank}\\x1b[0m: loading data")\n'
    'for step in tqdm(range(30), desc=f"rank {rank} training", mininterval=0, ncols=80):\n'
    "    time.sleep(0.03)\n"
    'print(f"rank {rank}: finished, loss {0.1 * (rank + 1):.3f}")\n'
    "0.1 * (rank + 1)",
    # 2: long, four ranks, rank 3 the straggler
    "%%distributed gpus=4 gpu_type=cpu\n"
    "import sys, time\n"
    "from tqdm import tqdm\n"
    "from serverless_gpu.runtime import get_global_rank\n"
    "\n"
    "rank = get_global_rank()\n"
    "bar = tqdm(range(100_000), desc=f'rank {rank}', file=sys.stderr, ncols=70, mininterval=0.5)\n"
    "for step in bar:\n"
    "    print(f'rank {rank} step {step}', flush=True)\n"
    "    time.sleep(0.04 * (1 + rank))",
    # 3: a function defined in this cell fails on rank 1
    "from serverless_gpu import distributed\n"
    "\n"
    "@distributed(gpus=2, gpu_type='cpu', standby=False)\n"
    "def flaky_step(batch):\n"
    "    from serverless_gpu.runtime import get_global_rank\n"
    "    if get_global_rank() == 1:\n"
    "        raise ValueError(f'batch {batch} has no labels')\n"
    "    import time\n"
    "    time.sleep(30)\n"
    "\n"
    "flaky_step.distributed(7)",
    # 4: rank 1 stuck in a function of its own, rank 0 busy: the hang warning, then Stacks
    "import time\n"
    "from serverless_gpu import distributed\n"
    "\n"
    "@distributed(gpus=2, gpu_type='cpu', standby=False, hang_warning=3)\n"
    "def shard_loader():\n"
    "    from serverless_gpu.runtime import get_global_rank\n"
    "\n"
    "    def stuck_here():\n"
    "        time.sleep(600)\n"
    "\n"
    "    if get_global_rank() == 1:\n"
    "        print('rank 1: opening shard 7', flush=True)\n"
    "        stuck_here()\n"
    "    for step in range(100_000):\n"
    "        print(f'rank 0 step {step}', flush=True)\n"
    "        time.sleep(0.2)\n"
    "\n"
    "shard_loader.distributed()",
]


def lab_folder(tmp_path: Path, notebook: str, cells: list[str]) -> tuple[Path, Path]:
    """A browser test's screenshots folder (``docs/`` when refreshing them) and the folder the
    server serves, holding ``notebook`` made of ``cells`` with the python3 kernel."""
    shots = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "lab"
    root.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in cells],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(nb, root / notebook)
    return shots, root


def test_run_widget_in_jupyterlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.sync_api import sync_playwright

    shots, root = lab_folder(tmp_path, NOTEBOOK, CELLS)
    monkeypatch.setenv("IPYTHONDIR", str(write_ipython_profile(tmp_path / "ipy", SLOW_TRACKING)))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with (
        lab_server(root, dict(os.environ), tmp_path / "lab.log") as server,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            page.goto(server.page_url(NOTEBOOK))
            kernel = _kernel_process(server.process.pid)
            _wait_idle(page, 60)
            _dismiss_notifications(page)
            _run_cell(page, 0)
            _short_run(page, shots)
            _long_run(page, shots, kernel)
            _failing_function(page, shots)
            _stacks_and_hang_warning(page, shots)
            _restart_and_reload(page, shots)
        finally:
            browser.close()
    assert wait_for(lambda: not pid_alive(kernel.pid), 10)


def _short_run(page: Any, shots: Path) -> None:
    """Starting state at once, then the record of the finished run (#22 items 2, 5)."""
    from playwright.sync_api import expect

    _run_cell(page, 1)
    run = _cell(page, 1).locator(".sgpu-run")
    # Shown before the (slow) tracking hook is done, clock counting from the call.
    expect(run.locator(".sgpu-header")).to_contain_text("starting (MLflow run)", timeout=5 * MS)
    run.screenshot(path=str(shots / "widget-starting.png"))
    record = _cell(page, 1).locator(".sgpu-record")
    expect(record).to_contain_text("run succeeded after", timeout=90 * MS)
    expect(_cell(page, 1).locator(".sgpu-run")).to_have_count(0)  # the widget made way
    elapsed = re.findall(r"run succeeded after ([\d.]+) s", record.inner_text())
    assert float(elapsed[0]) >= 2.0, (
        elapsed
    )  # the 2 s before the launch count: the clock starts at the call
    expect(record.get_by_role("link", name=re.compile("MLflow run"))).to_have_attribute(
        "href", re.compile(r"^http://127\.0\.0\.1:5000/#/experiments/0/runs/")
    )
    for rank in (0, 1):
        tail = record.locator(f'details[data-rank="{rank}"]')
        expect(tail).to_contain_text(f"rank {rank}: finished, loss")  # the last line is there
        if rank:
            tail.locator("summary").click()
        lines = tail.locator("pre").inner_text().splitlines()
        bars = [line for line in lines if f"rank {rank} training:" in line]
        assert len(bars) == 1 and "30/30" in bars[0], lines  # tqdm redraws one line
        expect(tail.locator('span[style*="color"]', has_text=f"rank {rank}").first).to_be_visible()
    expect(record.locator("tr", has_text="float 0.2")).to_contain_text("done")
    _cell(page, 1).scroll_into_view_if_needed()
    _cell(page, 1).locator(".jp-Cell-outputWrapper").screenshot(
        path=str(shots / "widget-record.png")
    )


def _long_run(page: Any, shots: Path, kernel: psutil.Process) -> None:
    """Panes follow the tail; scrolling up stops them; the full log in one click; all ranks;
    Cancel (#22 items 1, 4, 11, 12)."""
    from playwright.sync_api import expect

    _run_cell(page, 2)
    run = _cell(page, 2).locator(".sgpu-run")
    expect(run.locator(".sgpu-header")).to_contain_text("running", timeout=60 * MS)
    ranks = [p for p in descendants(kernel.pid) if p.ppid() != kernel.pid]
    # The all-ranks view is the first tab: one status line per rank, lines prefixed by rank.
    status = run.locator(".sgpu-rank-status")
    expect(status).to_have_count(4)
    expect(status.nth(3)).to_contain_text(re.compile(r"running.*\d+% \(\d+/100000\)"))
    merged = run.locator('.sgpu-rank-output[data-rank="all"]')
    expect(merged).to_contain_text("[rank 3] rank 3 step 2", timeout=30 * MS)
    header = run.locator(".sgpu-header")
    expect(header).to_contain_text(re.compile(r"progress: slowest rank 3 at .*fastest rank 0"))
    run.screenshot(path=str(shots / "widget.png"))

    run.locator(".lm-TabBar-tab", has_text="rank 0").click()
    pane = run.locator('.sgpu-rank-output[data-rank="0"]')
    expect(pane).to_contain_text("rank 0 step 250", timeout=60 * MS)  # step 0 has scrolled out
    _check_follows(page, pane, run, shots)
    with page.context.expect_page(timeout=20 * MS) as opened:
        run.get_by_role("button", name="open full log").first.click()
    log = opened.value
    expect(log.locator("body")).to_contain_text("rank 0 step 0\n", timeout=20 * MS)
    assert log.url.startswith("blob:"), log.url
    log.close()

    run.get_by_role("button", name="Cancel").click()
    assert not wait_gone(ranks, 5), "ranks still alive 5 s after Cancel"
    record = _cell(page, 2).locator(".sgpu-record")
    expect(record).to_contain_text("was cancelled", timeout=15 * MS)
    expect(record.locator("tr", has_text="cancelled")).to_have_count(4)
    error = _cell(page, 2).locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(error).to_have_text(
        "CancelledError: run cancelled: cancelled from the notebook widget", timeout=10 * MS
    )
    _wait_idle(page, 20)


def _check_follows(page: Any, pane: Any, run: Any, shots: Path) -> None:
    """At the bottom it follows; scrolled up it holds still; "follow" brings it back."""
    from playwright.sync_api import expect

    def newest() -> int:
        return max(int(n) for n in re.findall(r"rank 0 step (\d+)", pane.inner_text()))

    assert wait_for(lambda: _at_end(pane), 5), _scroll(pane)
    first = newest()
    assert wait_for(lambda: newest() > first + 5 and _at_end(pane), 10), _scroll(pane)
    follow = run.locator(".sgpu-pane-bar input.sgpu-follow:visible")
    expect(follow).to_be_checked()
    pane.evaluate("e => { e.scrollTop = 0; }")
    expect(follow).not_to_be_checked(timeout=3 * MS)
    run.screenshot(path=str(shots / "widget-rank.png"))
    held = pane.inner_text()
    page.wait_for_timeout(1500)  # several redraws' worth of new lines
    assert pane.inner_text() == held and _scroll(pane)["top"] == 0, _scroll(pane)
    follow.check()
    assert wait_for(lambda: _at_end(pane) and pane.inner_text() != held, 5), _scroll(pane)


def _failing_function(page: Any, shots: Path) -> None:
    """A function defined in a cell fails on rank 1: rank first, its cell and line, the run
    directory; no frames of the library (#22 items 3, 4, 6)."""
    from playwright.sync_api import expect

    _run_cell(page, 3)
    record = _cell(page, 3).locator(".sgpu-record")
    expect(record).to_contain_text("run failed", timeout=90 * MS)
    expect(record.locator("tr", has_text="rank 1 failed")).to_contain_text("stopped")
    expect(record.locator("tr", has_text="ValueError: batch 7 has no labels")).to_contain_text(
        "failed"
    )
    error = _cell(page, 3).locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(error).to_contain_text("run directory:", timeout=10 * MS)
    lines = error.inner_text().strip().splitlines()
    prompt = _cell(page, 3).locator(".jp-InputPrompt").inner_text()
    number = re.findall(r"\d+", prompt)[0]
    frame = f"  Cell In[{number}], line 7, in flaky_step"
    assert lines[0] == "rank 1 raised ValueError: batch 7 has no labels", lines
    assert frame in lines, lines
    assert (
        lines[lines.index(frame) + 1].strip() == "raise ValueError(f'batch {batch} has no labels')"
    )
    assert lines[-1].startswith("run directory: "), lines
    text = "\n".join(lines)
    for internal in ("rank/main.py", "handle.py", "magics.py", "RemoteTraceback", "<dynamic-code>"):
        assert internal not in text, text
    _cell(page, 3).locator(".jp-Cell-outputWrapper").screenshot(
        path=str(shots / "widget-error.png")
    )


def _stacks_and_hang_warning(page: Any, shots: Path) -> None:
    """A silent rank is named under the header; Stacks shows where each rank is, in its tab
    (#18 items 1, 3)."""
    from playwright.sync_api import expect

    _run_cell(page, 4)
    run = _cell(page, 4).locator(".sgpu-run")
    warning = run.locator(".sgpu-hang")
    expect(warning).to_contain_text("rank 1 silent for 3 s", timeout=60 * MS)
    expect(warning).not_to_contain_text("rank 0")
    run.get_by_role("button", name="Stacks").click()
    run.locator(".lm-TabBar-tab", has_text="rank 1").click()
    stacks = run.locator('.sgpu-stacks[data-rank="1"]')
    # The first summary is the rank's own line; folded library threads have their own below it.
    expect(stacks.locator("summary").first).to_contain_text("stuck_here", timeout=20 * MS)
    expect(stacks.locator("pre").first).to_contain_text("Main thread 0x")
    run.screenshot(path=str(shots / "widget-stacks.png"))
    run.locator(".lm-TabBar-tab", has_text="rank 0").click()
    expect(run.locator('.sgpu-stacks[data-rank="0"] summary').first).to_contain_text("shard_loader")
    run.get_by_role("button", name="Cancel").click()
    record = _cell(page, 4).locator(".sgpu-record")
    expect(record).to_contain_text("was cancelled", timeout=30 * MS)
    _wait_idle(page, 20)


def _restart_and_reload(page: Any, shots: Path) -> None:
    """Saved, kernel restarted, page reloaded: every run still reads as it ended (#22 item 2)."""
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
    records = page.locator(".sgpu-record")
    expect(records).to_have_count(4, timeout=30 * MS)
    expect(records.nth(0)).to_contain_text("run succeeded")
    expect(records.nth(1)).to_contain_text("was cancelled")
    expect(records.nth(2)).to_contain_text("run failed")
    expect(records.nth(3)).to_contain_text("was cancelled")
    expect(page.get_by_text("Error displaying widget")).to_have_count(0)
    _cell(page, 2).evaluate("e => e.scrollIntoView({block: 'start'})")
    page.locator(".jp-Notebook").screenshot(path=str(shots / "widget-after-restart.png"))


# -- JupyterLab helpers ---------------------------------------------------------------------


def _cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def _run_cell(page: Any, index: int) -> None:
    """Select cell ``index`` and run it with Shift+Enter."""
    _cell(page, index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def _run_when_connected(page: Any, index: int, tries: int = 3) -> None:
    """Run cell ``index``, whose code must bear running twice (``%load_ext``). Notebook 7 runs
    nothing on a press that comes before its kernel is connected, though its indicator may
    already say idle: the cell is run again while its prompt stays empty (10 s a try)."""
    from playwright.sync_api import expect

    prompt = _cell(page, index).locator(".jp-InputPrompt")
    for attempt in range(tries):
        _run_cell(page, index)
        try:
            expect(prompt).not_to_have_text("[ ]:", timeout=10 * MS)
            return
        except AssertionError:
            if attempt == tries - 1:
                raise


def _wait_idle(page: Any, seconds: float) -> None:
    from playwright.sync_api import expect

    idle = page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    expect(idle).to_be_visible(timeout=seconds * MS)


def _dismiss_notifications(page: Any) -> None:
    """Answers JupyterLab's news question ("No"), where it is asked. The name must match
    exactly: a substring match is the toolbar's "Notebook" button, which opens the notebook in
    Notebook 7 in a tab of its own (a second frontend of the kernel), and the Lab tab, then in
    the background, draws about one frame a second (each click or screenshot waits 1-5 s)."""
    news = page.get_by_role("button", name="No", exact=True)
    if news.count():
        news.first.click()


def _scroll(pane: Any) -> dict[str, int]:
    return dict(
        pane.evaluate("e => ({top: e.scrollTop, height: e.scrollHeight, view: e.clientHeight})")
    )


def _at_end(pane: Any) -> bool:
    s = _scroll(pane)
    return s["height"] > s["view"] and s["height"] - s["top"] - s["view"] < 8


def _kernel_process(server_pid: int, timeout: float = 60) -> psutil.Process:
    """The kernel the server started for the notebook."""
    found: list[psutil.Process] = []

    def started() -> bool:
        children = psutil.Process(server_pid).children()
        found[:] = [p for p in children if "ipykernel" in _cmdline(p)]
        return len(found) == 1

    assert wait_for(started, timeout), "no kernel started"
    return found[0]


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie the server has not reaped yet
        return ""
