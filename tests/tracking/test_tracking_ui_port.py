"""The MLflow UI's stable port per store: run links name it from the start, so a link made
before the UI started (or in an earlier kernel) works once a UI serves the store."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import tracking_fns
from mlflow import MlflowClient
from tracking_checks import http_status

from serverless_gpu import distributed
from serverless_gpu.tracking import stop_ui, store, ui

_PORT_SCRIPT = (
    "import sys\nfrom serverless_gpu.tracking import store\nprint(store.ui_ports(sys.argv[1])[0])\n"
)


def test_the_stable_port_is_the_same_in_every_process_and_differs_between_stores(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    other = subprocess.run(
        [sys.executable, "-c", _PORT_SCRIPT, uri],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    port = store.ui_ports(uri)[0]
    assert int(other.stdout) == port
    assert port in store.UI_PORT_RANGE
    assert store.ui_ports(f"sqlite:///{tmp_path}/other/mlflow.db")[0] != port
    # MLflow's default, relative store names the database in the working directory.
    assert store.ui_ports("sqlite:///mlflow.db") == store.ui_ports(
        f"sqlite:///{Path.cwd()}/mlflow.db"
    )


def test_without_a_ui_the_hint_names_the_run_the_store_and_the_stable_port(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    port = store.ui_ports(uri)[0]
    hint = store.open_hint(uri, "3", "abc")
    assert f"run abc in {uri}" in hint
    assert f"mlflow ui --backend-store-uri {uri} --port {port}" in hint
    assert f"http://127.0.0.1:{port}/#/experiments/3/runs/abc" in hint


def test_a_port_taken_by_something_else_is_skipped(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first, second = store.ui_ports(uri)[:2]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLFLOW_TRACKING_URI", uri)
            try:
                with pytest.warns(UserWarning, match=f"port {first} is taken"):
                    address = ui(wait=False)  # returns while the server starts
                assert address == f"http://127.0.0.1:{second}"
                assert store.ui_address(uri) == address
            finally:
                stop_ui()
    assert store.ui_address(uri) == f"http://127.0.0.1:{first}"


def test_a_run_made_before_the_ui_has_the_link_the_ui_then_serves(
    embedded: MlflowClient, store_dir: Path
) -> None:
    result = distributed(gpus=2, gpu_type="cpu")(tracking_fns.no_mlflow).distributed()
    run_id = result.metadata["mlflow_run_id"]
    uri = result.metadata["mlflow_tracking_uri"]
    link = result.links["mlflow"]
    stable = f"http://127.0.0.1:{store.ui_ports(uri)[0]}"
    assert link.startswith(f"{stable}/#/experiments/")
    assert http_status(f"{stable}/health") is None  # no UI serves the store yet
    try:
        assert ui() == stable
        assert http_status(link) == 200
        assert http_status(f"{stable}/ajax-api/2.0/mlflow/runs/get?run_id={run_id}") == 200
        # Another process (a restarted kernel) finds this UI serving the store and reuses it.
        again = subprocess.run(
            [sys.executable, "-c", "from serverless_gpu.tracking import ui; print(ui())"],
            cwd=store_dir,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        assert again.stdout.strip() == stable
        assert http_status(f"{stable}/health") == 200  # its exit stopped nothing of ours
    finally:
        stop_ui()
    assert http_status(f"{stable}/health") is None
