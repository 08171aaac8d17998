"""A tracked call returns with its results while its run's end is written behind it: the run is
complete once ``wait_written`` returns, a notebook's next cell waits for it by itself, and a
store that is slow to take the end costs the call nothing.

The store is a real ``mlflow server`` behind a proxy that holds the request ending a run
(``runs/update``) until the test lets it go, or ``_HOLD_LIMIT_S`` at the latest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nbformat
import pytest
import tracking_fns
from mlflow import MlflowClient
from nbclient import NotebookClient
from tracking_checks import Forwarding, Server

from serverless_gpu import distributed
from serverless_gpu.tracking import wait_written

_HOLD_LIMIT_S = 15.0
"""A held request goes on after this long at the latest (so that old code, which waited for
it inside the call, returns too, and the test fails on what it finds)."""


class _HoldingEnds(Forwarding):
    """Forwards every request to a real MLflow server; holds those that end a run."""

    release = threading.Event()
    held = threading.Event()

    def do_POST(self) -> None:
        body = self._body()
        if self.path.endswith("/runs/update") and b'"status"' in body:
            self.held.set()
            self.release.wait(_HOLD_LIMIT_S)
        self._forward(body)


@pytest.fixture
def holding(mlflow_server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The proxy's handler class (``release``, ``held``); the call's store is the proxy."""

    class Handler(_HoldingEnds):
        upstream = mlflow_server.url
        release = threading.Event()
        held = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", Handler.url)  # type: ignore[attr-defined]
    try:
        yield Handler
    finally:
        Handler.release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(120)
def test_a_call_returns_before_its_runs_end_is_written_and_wait_written_sees_it_through(
    holding: Any, mlflow_server: Server
) -> None:
    direct = MlflowClient(mlflow_server.url)  # reads around the proxy
    fn = distributed(gpus=2, gpu_type="cpu", timeout=60, output="none")(tracking_fns.log_points)
    result = fn.distributed(50)
    run_id = result.metadata["mlflow_run_id"]
    # The call is back while the store has not taken the run's end yet.
    assert holding.held.wait(10), "the run's end was never sent"
    assert direct.get_run(run_id).info.status == "RUNNING"
    assert not wait_written(0.2), "wait_written said done while the end was still held"
    holding.release.set()
    assert wait_written(30)
    run = direct.get_run(run_id)
    assert run.info.status == "FINISHED"
    for rank, key in ((0, "loss"), (1, "rank_1/loss")):
        assert len(direct.get_metric_history(run_id, key)) == 50, rank
    assert run.data.tags["serverless_gpu.status"] == "succeeded"


_CELLS = [
    "import mlflow\n"
    "from serverless_gpu import distributed\n"
    "@distributed(gpus=2, gpu_type='cpu', timeout=60, output='none')\n"
    "def train(steps):\n"
    "    import mlflow\n"
    "    for step in range(steps):\n"
    "        mlflow.log_metric('loss', 1.0 / (step + 1), step=step)\n"
    "    return steps\n",
    "result = train.distributed(20)",
    # Run right after the call's cell, as "Run all" does: the cell waits for the run's end.
    "run = mlflow.get_run(result.metadata['mlflow_run_id'])\n"
    "history = mlflow.MlflowClient().get_metric_history(run.info.run_id, 'loss')\n"
    "print(run.info.status, len(history))",
]


@pytest.mark.timeout(180)
def test_a_notebooks_next_cell_finds_the_run_complete(holding: Any, tmp_path: Path) -> None:
    # The proxy lets the end go 3 s after it arrives: well after the next cell would have read
    # the run, had that cell not waited for it.
    def release_later() -> None:
        if holding.held.wait(60):
            threading.Timer(3.0, holding.release.set).start()

    threading.Thread(target=release_later, daemon=True).start()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in _CELLS])
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert printed.strip().splitlines()[-1] == "FINISHED 20", printed
