"""A tracking server that answers ``/health`` but never answers an API call: the call runs,
untracked, with one warning, instead of waiting for MLflow's retries."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import tracking_fns
from tracking_checks import Forwarding, Server

from serverless_gpu import distributed
from serverless_gpu.tracking import TrackingWarning, wait_written, writer

_HANG_LIMIT_S = 120.0
"""A hanging request is released after this long at the latest, so the server always stops."""


class _HealthyButHanging(BaseHTTPRequestHandler):
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.startswith("/health"):
            self._answer(200, b"OK")
        else:
            self._hang()

    def do_POST(self) -> None:
        self._hang()

    def _hang(self) -> None:
        self.release.wait(_HANG_LIMIT_S)
        self._answer(503, b"released")

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hanging_server() -> Iterator[str]:
    class Handler(_HealthyButHanging):
        release = threading.Event()

    handler = Handler
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(120)
def test_a_server_that_hangs_on_api_calls_does_not_block_the_call(
    hanging_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", hanging_server)
    monkeypatch.setenv("SERVERLESS_GPU_MLFLOW_START_TIMEOUT", "2")
    fn = distributed(gpus=2, gpu_type="cpu", timeout=60)(tracking_fns.log_points)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn.distributed(5)
    assert len(result) == 2
    assert "mlflow_run_id" not in result.metadata
    ours = [w for w in caught if issubclass(w.category, TrackingWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    text = str(ours[0].message)
    assert hanging_server in text and "did not answer within 2 s" in text
    # What the ranks logged is kept in the run directory, in the file the warning names.
    unsent = result.run_dir / "mlflow_unsent.jsonl"
    assert str(unsent) in text and unsent.exists()


class _HangingWrites(Forwarding):
    """Forwards to a real MLflow server, except that writes of metrics never get an answer."""

    release = threading.Event()

    def do_POST(self) -> None:
        body = self._body()
        if "log-batch" in self.path:
            self.release.wait(_HANG_LIMIT_S)
            self._answer(503, b"released")
            return
        self._forward(body)


@pytest.mark.timeout(200)
def test_a_server_that_stops_answering_writes_ends_tracking_within_the_stall_bound(
    mlflow_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Handler(_HangingWrites):
        upstream = mlflow_server.url
        release = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setattr(writer, "STALL_S", 3.0)  # the bound under test, shorter than 30 s
        fn = distributed(gpus=2, gpu_type="cpu", timeout=60)(tracking_fns.log_points)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn.distributed(5)
            # The call returned; its end is written behind, where the stall bound applies:
            # the wait gives up on the server within STALL_S (plus a health check's slice).
            assert wait_written(30)
        assert len(result) == 2
        ours = [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)]
        assert len(ours) == 1 and "tracking stopped" in ours[0], ours
    finally:
        Handler.release.set()
        server.shutdown()
        server.server_close()
