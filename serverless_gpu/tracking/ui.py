"""``ui()``: the MLflow web UI for the embedded store, served from this process's machine.

The server runs under a small guard process (:mod:`.ui_guard`) in its own session: it is
stopped at exit, and the guard tears the whole group down (uvicorn workers included) when this
process dies in any way, even SIGKILL, because the pipe it watches then reads end-of-file.
"""

from __future__ import annotations

import atexit
import json
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
import warnings
from pathlib import Path

import psutil

from . import private, store

_START_TIMEOUT_S = 120.0
_LOG_PREFIX = "serverless-gpu-mlflow-ui-"
"""``<tmp>/serverless-gpu-mlflow-ui-<pid>.log``: the server's output, one file per process."""
_STOP_GRACE_S = 5.0
_PROBE_TIMEOUT_S = 2.0


class _Server:
    def __init__(self, uri: str, address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.uri = uri
        self.address = address
        self.proc = proc
        self.log = log


_server: _Server | None = None
_lock = threading.Lock()


def ui(port: int | None = None, *, wait: bool = True) -> str:
    """Serve the MLflow UI for the current tracking store on 127.0.0.1; return its address.

    Without ``port``, the store's stable port (the one its run links name from the start, so
    links made before the UI, or in an earlier kernel, work once it serves); a UI already
    serving this store there is reused. Started once per process, in the background; later calls
    return the same address. ``wait=False`` returns the address at once, while the server is
    still starting. For an HTTP tracking server this returns that server's address and starts
    nothing.
    """
    import mlflow

    uri = mlflow.get_tracking_uri()
    if store.is_http(uri):
        return uri.rstrip("/")
    with _lock:
        address, server = _serve_locked(uri, port)
    if server is not None:
        if wait:
            _await(server)
        else:
            threading.Thread(target=_await_quietly, args=(server,), daemon=True).start()
    return address


def _serve_locked(uri: str, port: int | None) -> tuple[str, _Server | None]:
    """The address serving ``uri``: this process's server, one already serving it on a port
    tried, or a server started on the first free one (returned while it starts)."""
    global _server
    if _server is not None and _server.proc.poll() is None and _server.uri == uri:
        return _server.address, _server
    if _server is not None:
        _stop_locked()
    ports = [port] if port else store.ui_ports(uri)
    for candidate in ports:
        address = f"http://127.0.0.1:{candidate}"
        if _port_free(candidate):
            _server = _spawn(uri, candidate)
            store.set_ui_address(uri, address)
            return address, _server
        if _serves_store(address, uri):
            store.set_ui_address(uri, address)
            return address, None
        if candidate != ports[-1]:
            warnings.warn(
                f"serverless_gpu: port {candidate} is taken by something other than an MLflow "
                f"UI of {uri}; trying the next one (run links made before name port "
                f"{ports[0]})",
                stacklevel=3,
            )
    raise RuntimeError(f"no free port for the MLflow UI of {uri}: tried {ports}")


def _await(server: _Server) -> None:
    try:
        _wait_until_up(server)
    except BaseException:
        with _lock:
            if _server is server:
                _stop_locked()
            else:
                _terminate(server)
        raise


def _await_quietly(server: _Server) -> None:
    """``ui(wait=False)``'s watcher: a server that does not come up is stopped; its log says why."""
    try:
        _await(server)
    except Exception:
        pass


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the server binds: a port left in TIME_WAIT by a stopped UI counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serves_store(address: str, uri: str) -> bool:
    """Whether the MLflow UI at ``address`` shows this store: it lists the same experiments
    (ids, names and creation times, which differ between any two stores)."""
    from mlflow import MlflowClient

    url = f"{address}/ajax-api/2.0/mlflow/experiments/search?max_results=1000"
    try:
        with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_S) as response:
            served = json.load(response).get("experiments", [])
        ours = MlflowClient(uri).search_experiments(max_results=1000)
    except Exception:  # not an MLflow UI, or not one that answers: not ours to reuse
        return False
    key = {(e["experiment_id"], e["name"], int(e.get("creation_time", 0))) for e in served}
    return bool(ours) and key == {(e.experiment_id, e.name, e.creation_time or 0) for e in ours}


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


def _spawn(uri: str, port: int) -> _Server:
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
    return _Server(uri, address, proc, log)


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


atexit.register(stop_ui)
