"""A notebook executed headless (papermill, as a scheduled job runs it), reopened in JupyterLab
in headless Chromium: it shows the records the job saved, the run's MLflow link and every trial
of the table, as the file holds them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from lab_server import CHROMIUM, CHROMIUM_ARGS, lab_server
from test_browser import MS, _cell
from test_headless_records import _MLFLOW_LINK, _html, _papermill
from test_headless_records import tracked as tracked  # the fixture: kernels with tracking on

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs {CHROMIUM}"),
]


def test_a_notebook_run_headless_reopens_with_its_records(tracked: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    nb = _papermill(tracked)  # writes out.ipynb into the folder the server serves
    [link] = _MLFLOW_LINK.findall(_html(nb.cells[1]))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tracked / "runtime")}
    with lab_server(tracked, env, tracked / "lab.log") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page: Any = browser.new_page(viewport={"width": 1200, "height": 1000})
            page.goto(server.page_url("out.ipynb"))
            # An untrusted notebook (a job's output): JupyterLab sanitizes the HTML (classes,
            # data attributes), so what the reader sees is asked for by role and text.
            record = _cell(page, 1)
            mlflow = record.get_by_role("link", name=re.compile("MLflow run"))
            expect(mlflow).to_have_attribute("href", link, timeout=60 * MS)
            expect(record).to_contain_text("run succeeded")
            expect(record).not_to_contain_text("starting the MLflow UI")
            table = _cell(page, 3)
            expect(table).to_contain_text("2 trials: 2 succeeded")
            for value in ("6", "8"):
                row = table.get_by_role("row", name=re.compile(rf"succeeded .* {value} run"))
                expect(row).to_have_count(1)
            expect(table).not_to_contain_text("no trials yet")
        finally:
            browser.close()
