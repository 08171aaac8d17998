"""The widget's "Open in MLflow" button: it starts the UI off the kernel's thread and then links
the run's page at the address that UI serves."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jupyter_ext.widget import WidgetRenderer
from serverless_gpu.config import DistributedConfig
from serverless_gpu.gpus import GPUType, Placement
from serverless_gpu.hooks import RunContext
from serverless_gpu.runpaths import RunPaths
from serverless_gpu.runspec import RunSpec
from serverless_gpu.tracking import stop_ui, store

_START_BOUND_S = 150.0


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def test_open_in_mlflow_starts_the_ui_in_the_background_and_links_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    placement = Placement(2, "cpu", GPUType.parse("cpu"), ())
    config = DistributedConfig(gpu_type="cpu", timeout=None)
    ctx = RunContext(RunSpec("r1", "train", placement, RunPaths(tmp_path), config))
    renderer = WidgetRenderer(ctx, show=False)
    assert renderer.mlflow_button.layout.display == "none"  # not tracked (yet): no button
    link = store.run_link(uri, "0", "abc")
    ctx.links["mlflow"] = link  # as tracking sets it, after the widget is shown
    renderer.set_phase("launcher")
    assert renderer.mlflow_button.layout.display is None
    try:
        renderer.mlflow_button.click()
        # The click returned; the UI starts on its own thread, bounded by its start timeout.
        thread = renderer._mlflow_thread
        assert thread is not None
        assert renderer.mlflow_button.disabled
        assert renderer.mlflow_button.description == "Starting MLflow..."
        thread.join(_START_BOUND_S)
        assert not thread.is_alive()
        assert renderer.mlflow_button.layout.display == "none"
        assert f'href="{link}"' in renderer.mlflow_open.value
        assert 'target="_blank"' in renderer.mlflow_open.value
        assert _status(f"{store.ui_address(uri)}/health") == 200
    finally:
        stop_ui()
