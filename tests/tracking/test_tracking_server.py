"""A real ``mlflow server``: the same recording, a link that answers, and a server that dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
import tracking_fns
from mlflow import MlflowClient
from mlflow.entities import Run
from procs import wait_gone
from tracking_checks import Server, check_run_contents, http_status

from serverless_gpu import distributed
from serverless_gpu.tracking import TrackingWarning, store, wait_written

RunsOf = Callable[[MlflowClient], list[Run]]


def test_runs_on_a_tracking_server_with_a_link_that_answers(
    remote: MlflowClient,
    experiment_runs: RunsOf,
    mlflow_server: Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.log_points_and_a_file)
    with mlflow.start_run() as parent:
        nested = fn.distributed(30, str(tmp_path))
    alone = fn.distributed(30, str(tmp_path))

    out = capsys.readouterr().out
    runs = experiment_runs(remote)
    ids = {nested.metadata["mlflow_run_id"], alone.metadata["mlflow_run_id"]}
    assert {r.info.run_id for r in runs} == ids | {parent.info.run_id}
    for result in (nested, alone):
        run = remote.get_run(result.metadata["mlflow_run_id"])
        check_run_contents(remote, run, steps=30, function="log_points_and_a_file")
        notes = {a.path for a in remote.list_artifacts(run.info.run_id, "notes")}
        assert notes == {"notes/note_0.txt", "notes/note_1.txt"}
        link = result.links["mlflow"]
        experiment = run.info.experiment_id
        page = f"{mlflow_server.url}/#/experiments/{experiment}/runs/{run.info.run_id}"
        assert link == page + store.RUN_PAGE_QUERY
        assert http_status(link) == 200
        assert result.metadata["mlflow_run_url"] == link
        where = f"run {run.info.run_id} in {mlflow_server.url}: {link}"
        assert out.count(f"serverless_gpu: MLflow {where}\n") == 1  # printed once, at start
    assert (
        remote.get_run(nested.metadata["mlflow_run_id"]).data.tags["mlflow.parentRunId"]
        == parent.info.run_id
    )
    assert "mlflow.parentRunId" not in remote.get_run(alone.metadata["mlflow_run_id"]).data.tags


def test_server_killed_mid_run_results_still_returned_with_one_warning(
    own_mlflow_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", own_mlflow_server.url)
    marker = tmp_path / "kill-now"

    def kill_when_told() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        own_mlflow_server.kill()

    killer = threading.Thread(target=kill_when_told, daemon=True)
    killer.start()
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.survive_server_death)
    started = time.monotonic()
    with pytest.warns(TrackingWarning) as caught:
        result = fn.distributed(str(marker), own_mlflow_server.url, 200)
        assert wait_written(60)  # the warning comes with the run's end, at the latest
    killer.join()

    assert list(result) == [0, 1]
    assert len([w for w in caught if issubclass(w.category, TrackingWarning)]) == 1
    assert "tracking stopped" in str(caught[0].message)
    assert time.monotonic() - started < 90, "the caller must not sit out MLflow's retries"
    logs = result.run_dir / "logs"
    assert (logs / "rank_0.txt").exists() and (logs / "rank_1.txt").exists()
    unsent = [json.loads(line) for line in (result.run_dir / "mlflow_unsent.jsonl").open()]
    after = [m for r in unsent if r["kind"] == "batch" for m in r["data"]["metrics"]]
    # A batch the writer was sending when the server died may still be in flight; the others
    # (rank 0's "after", rank 1's "rank_1/after") are kept.
    assert {m[0] for m in after} & {"after", "rank_1/after"}


def test_server_down_at_start_runs_untracked_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    fn = distributed(gpus=2, gpu_type="cpu", timeout=300)(tracking_fns.log_points)
    with pytest.warns(TrackingWarning, match="not tracked") as caught:
        result = fn.distributed(100)

    # Not a speed claim (benchmarks/mlflow_logging.py measures that): a rank waiting on the
    # server's retries would spend seconds per call, far over this bound.
    assert len(result) == 2 and max(result) < 5.0
    assert len([w for w in caught if issubclass(w.category, TrackingWarning)]) == 1
    assert "mlflow_run_id" not in result.metadata
    unsent = [json.loads(line) for line in (result.run_dir / "mlflow_unsent.jsonl").open()]
    losses = [m for r in unsent if r["kind"] == "batch" for m in r["data"]["metrics"]]
    assert len([m for m in losses if m[0] == "loss"]) == 100  # rank 0's
    assert len([m for m in losses if m[0] == "rank_1/loss"]) == 100


_SERVER_OWNER = """
import sys
import psutil
from tracking_checks import start_server
from pathlib import Path
server = start_server(Path(sys.argv[1]))
below = psutil.Process(server.proc.pid).children(recursive=True)
group = [server.proc.pid] + [p.pid for p in below]
print(*group, flush=True)
sys.stdin.read()
"""


def test_a_test_servers_processes_end_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A test process killed by a timeout (or an interrupted run) takes its server with it: the
    guard, the server and its uvicorn worker (they lived on, in a session of their own)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    owner = subprocess.Popen(
        [sys.executable, "-c", _SERVER_OWNER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert owner.stdout is not None
    group = [int(pid) for pid in owner.stdout.readline().split()]  # bounded by the start's 120 s
    try:
        assert len(group) >= 2, group  # mlflow server and uvicorn (and the guard)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        left = wait_gone(group, 15)
        assert not left, f"the server outlived its owner: {left}"
    finally:
        if group:
            try:
                os.killpg(group[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
        owner.kill()
        owner.wait(10)
