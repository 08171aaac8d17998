"""Helpers shared by the tracking tests: a real MLflow server and the checks of a run's contents.

(A plain module rather than conftest.py, whose name other test directories use too.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run


def check_run_contents(
    client: MlflowClient, run: Run, steps: int, function: str, world_size: int = 2
) -> None:
    """What every tracked run records: rank metrics with steps, params, tags, rank logs."""
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    for rank in range(world_size):
        # Rank 0's metrics under their own name, rank N's under rank_N/.
        history = client.get_metric_history(run_id, rank_key(rank, "loss"))
        points = sorted((m.step, m.value) for m in history)
        assert points == [(s, float(rank * 1_000_000 + s)) for s in range(steps)]
        assert run.data.metrics[f"rank_{rank}/done"] == 1.0
        assert run.data.tags[f"from_rank_{rank}"] == "yes"
    params = run.data.params
    assert params["lr"] == "0.1"
    assert params["serverless_gpu.gpus"] == str(world_size)
    assert params["serverless_gpu.gpu_type"] == "CPU"
    assert params["serverless_gpu.world_size"] == str(world_size)
    assert params["serverless_gpu.timeout"] == "300"
    assert params["serverless_gpu.function"] == function
    assert params["serverless_gpu.version"] and params["serverless_gpu.torch_version"]
    tags = run.data.tags
    assert tags["serverless_gpu.host"] == socket.gethostname()
    assert tags["serverless_gpu.gpu_names"] == "CPU"
    assert tags["serverless_gpu.status"] == "succeeded"
    assert not any("PATH" in v or "MLFLOW_RUN_ID" in k for k, v in params.items() | tags.items())
    assert "system/cpu_utilization_percentage" in run.data.metrics
    logs = {a.path for a in client.list_artifacts(run_id, "logs")}
    assert logs == {f"logs/rank_{r}.txt" for r in range(world_size)}
    text = Path(client.download_artifacts(run_id, "logs/rank_1.txt")).read_text()
    assert f"rank 1 logged {steps} points" in text


def rank_key(rank: int, key: str) -> str:
    """Where a rank's metric ``key`` is recorded."""
    return key if rank == 0 else f"rank_{rank}/{key}"


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def start_server(root: Path) -> Server:
    """A real ``mlflow server`` (SQLite backend, proxied artifacts) on a free local port, under
    the guard ``ui()`` uses (``tracking/ui_guard.py``): its whole group ends when this process
    does, in any way (a worker killed by a timeout, an interrupted run), not only by ``kill``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = [
        sys.executable, "-m", "serverless_gpu.tracking.ui_guard", "--",
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{root}/server.db",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    with open(root / "server.log", "ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,  # the guard's lifeline: end-of-file when this process is gone
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
        if http_status(f"{server.url}/health") == 200:
            return server
        time.sleep(0.2)
    server.kill()
    raise TimeoutError("mlflow server did not start")


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


class Forwarding(BaseHTTPRequestHandler):
    """A proxy's handler: every request goes on to the real MLflow server at ``upstream``.
    Subclasses hold back or refuse the requests a test is about."""

    upstream = ""

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self._body())

    def do_PUT(self) -> None:  # artifact uploads (the ranks' logs)
        self._forward(self._body())

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _forward(self, body: bytes | None) -> None:
        request = urllib.request.Request(
            self.upstream + self.path, data=body, method=self.command,
            headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                self._answer(response.status, response.read())
        except urllib.error.HTTPError as exc:
            self._answer(exc.code, exc.read())

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass
