"""The widget's MLflow link: the UI starts, off the kernel's thread, as soon as the run has its
link, so the one link in the header opens; the record links the UI that serves the store, and
says how to serve it when none does."""

from __future__ import annotations

import io
import re
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from nbclient import NotebookClient

from jupyter_ext import html_view
from jupyter_ext.runstate import RunView
from jupyter_ext.text_renderer import TextRenderer
from jupyter_ext.widget import WidgetRenderer
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common.gpus import GPUType, Placement
from serverless_gpu.tracking import stop_ui, store
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.events import RunFinished
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

_START_BOUND_S = 150.0
_MLFLOW_LINK = re.compile(r'<a class="sgpu-link" data-link="mlflow" href="([^"]+)"')


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def _tracked_context(tmp_path: Path, uri: str) -> RunContext:
    """A run's context as the tracking hook leaves it: the link and the store it names."""
    placement = Placement(2, "cpu", GPUType.parse("cpu"), ())
    config = DistributedConfig(gpu_type="cpu", timeout=None)
    ctx = RunContext(RunSpec("r1", "train", placement, RunPaths(tmp_path), config))
    ctx.links["mlflow"] = store.run_link(uri, "0", "abc")
    ctx.metadata.update(mlflow_tracking_uri=uri, mlflow_run_id="abc", mlflow_experiment_id="0")
    return ctx


def test_the_ui_starts_with_the_run_and_the_header_has_one_link_that_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    renderer = WidgetRenderer(_tracked_context(tmp_path, uri), show=False)
    renderer.set_phase("launcher")  # the first draw with the run's link: nothing pressed
    try:
        thread = renderer._mlflow_thread
        assert thread is not None, "the MLflow UI starts when the run has its link"
        assert renderer.mlflow_button.layout.display == "none"
        if thread.is_alive():  # while it starts, no link that cannot open
            assert not _MLFLOW_LINK.search(renderer.header.value)
        thread.join(_START_BOUND_S)
        assert not thread.is_alive()
        renderer._draw_header()
        links = _MLFLOW_LINK.findall(renderer.header.value)
        address = store.ui_address(uri)
        assert links == [f"{address}/#/experiments/0/runs/abc?workflowType=machine_learning"]
        assert _status(f"{address}/health") == 200
        assert renderer.mlflow_button.layout.display == "none"
    finally:
        stop_ui()


def test_a_ui_that_does_not_start_leaves_a_retry_button_and_no_dead_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    uri = f"sqlite:///{tmp_path}/a-file/mlflow.db"  # a store the server cannot open
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    renderer = WidgetRenderer(_tracked_context(tmp_path, uri), show=False)
    renderer.set_phase("launcher")
    try:
        thread = renderer._mlflow_thread
        assert thread is not None
        thread.join(_START_BOUND_S)
        assert not thread.is_alive()
        assert renderer.mlflow_button.layout.display is None
        assert renderer.mlflow_button.description == "Retry MLflow UI"
        assert renderer.mlflow_button.layout.width == "auto"  # the label is never cut
        assert "exited" in renderer.mlflow_button.tooltip
        assert not _MLFLOW_LINK.search(renderer.header.value)
        assert "the MLflow UI did not start" in renderer.header.value
    finally:
        stop_ui()


def test_the_record_says_how_to_serve_the_store_when_no_ui_does(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    view = RunView(_tracked_context(tmp_path, uri))
    linked = html_view.record_html(view)
    assert "sgpu-mlflow-hint" not in linked  # a link not known dead needs no help
    record = html_view.record_html(view, pending={"mlflow": "the MLflow UI did not start"})
    port = store.ui_ports(uri)[0]
    [link] = _MLFLOW_LINK.findall(linked)
    assert link == f"http://127.0.0.1:{port}/#/experiments/0/runs/abc?workflowType=machine_learning"
    assert f"python -m serverless_gpu.tracking.serve_ui {uri} abc" in record
    assert f"mlflow ui --backend-store-uri {uri} --port {port}" in record
    assert "serverless_gpu.tracking.ui()" in record


_CELLS = [
    "%load_ext jupyter_ext",
    "%%distributed gpus=1 gpu_type=cpu\nprint('short run')",
    # The record of the run above is updated (by display id) by the widget's UI thread once
    # the UI serves the store; the thread ends after that.
    "import threading, urllib.request\n"
    "from serverless_gpu.tracking import store\n"
    "import mlflow\n"
    "for t in threading.enumerate():\n"
    "    if t.name == 'serverless-gpu-mlflow-ui':\n"
    "        t.join(150)\n"
    "address = store.ui_address(mlflow.get_tracking_uri())\n"
    "with urllib.request.urlopen(address + '/health', timeout=10) as r:\n"
    "    print('health', r.status, address)",
]


def test_a_short_run_in_a_real_kernel_leaves_a_record_linking_a_live_ui(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "ipython-tracked" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.HistoryManager.enabled = False\n")
    monkeypatch.setenv("IPYTHONDIR", str(profile.parent))  # tracking on, unlike other kernels
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in _CELLS])
    client = NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    health = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "health 200" in health, nb.cells[2].outputs
    address = health.split()[-1]
    records = [o.data["text/html"] for o in nb.cells[1].outputs if "text/html" in o.get("data", {})]
    assert records, nb.cells[1].outputs
    links = _MLFLOW_LINK.findall(records[-1])
    assert len(links) == 1, links  # one link, no second one beside it
    assert links[0].startswith(f"{address}/#/experiments/")
    assert links[0].endswith("?workflowType=machine_learning")
    # A link that opens needs no help, and a shared notebook carries no local store path.
    assert "serverless_gpu.tracking.serve_ui" not in records[-1]
    assert "sqlite:///" not in records[-1]


def test_the_text_record_says_how_to_serve_the_store_when_no_ui_does(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = io.StringIO()
    renderer = TextRenderer(_tracked_context(tmp_path, uri), stream=out)
    renderer(RunFinished.succeeded("r1", 1.0))
    text = out.getvalue()
    assert f"MLflow run abc in {uri}; to see it, run `python -m serverless_gpu" in text
    assert f"mlflow ui --backend-store-uri {uri} --port {store.ui_ports(uri)[0]}" in text
    assert "/#/experiments/0/runs/abc?workflowType=machine_learning" in text


def test_a_run_whose_ui_did_not_start_keeps_a_button_under_its_record_that_starts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shell: InteractiveShell
) -> None:
    blocker = tmp_path / "store"
    blocker.write_text("")  # a file where the store's folder goes: the UI cannot start
    uri = f"sqlite:///{blocker}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    renderer = WidgetRenderer(_tracked_context(tmp_path, uri), shell)  # shown, as in a notebook
    renderer.set_phase("launcher")
    try:
        thread = renderer._mlflow_thread
        assert thread is not None
        thread.join(_START_BOUND_S)
        renderer(RunFinished.succeeded("r1", 1.0))
        assert "the MLflow UI did not start" in renderer.record
        assert "python -m serverless_gpu.tracking.serve_ui" in renderer.record
        button = renderer.mlflow_button
        assert renderer._button_display is not None and button.layout.display is None
        assert button.description == "Start MLflow UI"
        blocker.unlink()
        blocker.mkdir()  # the store's folder is there now
        button.click()
        thread = renderer._mlflow_thread
        assert thread is not None
        thread.join(_START_BOUND_S)
        assert not thread.is_alive()
        [link] = _MLFLOW_LINK.findall(renderer.record)
        assert link.startswith(f"{store.ui_address(uri)}/#/experiments/0/runs/abc")
        assert _status(f"{store.ui_address(uri)}/health") == 200
        assert renderer._button_display is None  # the button made way for the link
    finally:
        stop_ui()
