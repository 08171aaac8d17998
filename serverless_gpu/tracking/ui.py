"""``ui()``: the MLflow web UI for the embedded store, served from this process's machine.

The server runs under a small guard process (:mod:`.ui_guard`) in its own session: it is
stopped at exit, and the guard tears the whole group down (uvicorn workers included) when this
process dies in any way, even SIGKILL, because the pipe it watches then reads end-of-file.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from . import private, store

_START_TIMEOUT_S = 120.0
_LOG_PREFIX = "serverless-gpu-mlflow-ui-"
"""``<tmp>/serverless-gpu-mlflow-ui-<pid>.log``: the server's output, one file per process."""
_STOP_GRACE_S = 5.0


class _Server:
    def __init__(self, uri: str, address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.uri = uri
        self.address = address
        self.proc = proc
        self.log = log


_server: _Server | None = None
_lock = threading.Lock()


def ui(port: int | None = None) -> str:
    """Serve the MLflow UI for the current tracking store on 127.0.0.1; return its address.

    Started once per process, in the background; later calls return the same address, and the
    links of later runs (printed, and in ``result.links["mlflow"]``) point at it. For an HTTP
    tracking server this returns that server's address and starts nothing.
    """
    global _server
    import mlflow

    uri = mlflow.get_tracking_uri()
    if store.is_http(uri):
        return uri.rstrip("/")
    with _lock:
        if _server is not None and _server.proc.poll() is None and _server.uri == uri:
            return _server.address
        if _server is not None:
            _stop_locked()
        _server = _start(uri, port or _free_port())
        store.set_ui_address(uri, _server.address)
        return _server.address


def stop_ui() -> None:
    """Stop the server ``ui()`` started, if any (also done at exit)."""
    with _lock:
        _stop_locked()


def _stop_locked() -> None:
    global _server
    server, _server = _server, None
    if server is not None:
        store.set_ui_address(server.uri, None)
        _terminate(server)


def _terminate(server: _Server) -> None:
    if server.proc.stdin is not None:
        server.proc.stdin.close()  # the guard reads EOF and stops its group
    try:
        server.proc.wait(_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    server.proc.wait()
    _remove_if_empty(server.log)


def _prune_logs(folder: Path) -> None:
    """The UI logs of processes that are gone (ours only; a live process's log stays)."""
    for path in folder.glob(f"{_LOG_PREFIX}*.log"):
        pid = path.name.removeprefix(_LOG_PREFIX).removesuffix(".log")
        try:
            info = path.lstat()
            if not pid.isdigit() or info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
                continue
            if not psutil.pid_exists(int(pid)):
                path.unlink()
        except OSError:
            continue


def _remove_if_empty(log: Path) -> None:
    try:
        if log.stat().st_size == 0:
            log.unlink()
    except OSError:
        pass


def _start(uri: str, port: int) -> _Server:
    address = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"{_LOG_PREFIX}{os.getpid()}.log"
    _prune_logs(log.parent)
    env = dict(os.environ)
    # A viewer needs no background job runner (it would start a dozen more processes).
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    command = [
        sys.executable, "-m", "serverless_gpu.tracking.ui_guard", "--",
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
        # Experiments the server creates (the default one, in a new store) keep their artifacts
        # where this process's own MLflow client puts them: with the server's proxied
        # "mlflow-artifacts:" default, runs logged from here could not store a single file.
        "--default-artifact-root", private.client_artifact_root(),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    with open(
        os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), "ab"
    ) as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C meant for the notebook does not reach it
        )
    server = _Server(uri, address, proc, log)
    try:
        _wait_until_up(server)
    except BaseException:
        _terminate(server)
        raise
    return server


def _wait_until_up(server: _Server) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the MLflow UI server exited; its log: {server.log}")
        try:
            with urllib.request.urlopen(f"{server.address}/health", timeout=2.0):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"the MLflow UI server did not start in time; its log: {server.log}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


atexit.register(stop_ui)
