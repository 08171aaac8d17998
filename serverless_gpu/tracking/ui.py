"""``ui()``: the MLflow web UI for the embedded store, served from this process's machine to
this user alone.

The server runs under a small guard process (:mod:`.ui_guard`) in its own session: it is
stopped at exit, and the guard tears the whole group down (uvicorn workers included) when this
process dies in any way, even SIGKILL, because the pipe it watches then reads end-of-file.

The store is private (mode 0600), so its UI must be too: the MLflow server listens on a Unix
socket in a private folder, and the port on 127.0.0.1 is kept by the guard's gate
(:mod:`.ui_gate`), which relays only connections of the user who started it. This process binds
that port itself before the server starts (so nobody can take it in between), and a port it
finds taken is used only when this user's own process listens there and serves this store.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from serverless_gpu.runfiles import rundirs
from serverless_gpu.tracking import private, store, ui_gate

_START_TIMEOUT_S = 120.0
_LOG_PREFIX = "mlflow-ui-"
"""``<runs root>/mlflow-ui-<pid>-<random>.log``: the server's output, one new file per start."""
_SOCKET_PARENT_MAX = 60
"""Bytes of the socket's parent path; with ``sgpu-mlflow-ui-XXXXXXXX/server.sock`` below it,
the address stays within the 107 bytes a Unix socket's path may have."""
_STOP_GRACE_S = 5.0
_PROBE_TIMEOUT_S = 2.0


class _Server:
    def __init__(
        self, uri: str, address: str, proc: subprocess.Popen[bytes], log: Path, folder: Path
    ) -> None:
        self.uri = uri
        self.address = address
        self.proc = proc
        self.log = log
        self.folder = folder
        """The private folder of the server's Unix socket."""


_server: _Server | None = None
_lock = threading.Lock()


def ui(
    port: int | None = None,
    *,
    wait: bool = True,
    on_address: Callable[[str], None] | None = None,
) -> str:
    """Serve the MLflow UI for the current tracking store on 127.0.0.1; return its address.

    Without ``port``, the store's stable port (the one its run links name from the start, so
    links made before the UI, or in an earlier kernel, work once it serves); a UI already
    serving this store there is reused. Started once per process, in the background; later calls
    return the same address. ``wait=False`` returns the address at once, while the server is
    still starting. For an HTTP tracking server this returns that server's address and starts
    nothing. ``on_address`` is called with the address as soon as it is known, before the
    server answers (a notebook's record links the run without waiting for the UI).
    """
    import mlflow

    uri = mlflow.get_tracking_uri()
    if store.is_http(uri):
        return uri.rstrip("/")
    with _lock:
        address, server = _serve_locked(uri, port)
    if on_address is not None:
        on_address(address)
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
        listener = _bind(candidate)
        if listener is not None:
            with listener:
                _server = _spawn(uri, listener)
            store.set_ui_address(uri, address)
            return address, _server
        owner = ui_gate.listener_uid(candidate)
        if owner == os.getuid() and _serves_store(address, uri):
            store.set_ui_address(uri, address)
            return address, None
        if candidate != ports[-1]:
            warnings.warn(
                f"serverless_gpu: port {candidate} is taken by {_holder(owner, uri)}; trying "
                f"the next one (run links made before name port {ports[0]})",
                stacklevel=3,
            )
    raise RuntimeError(f"no free port for the MLflow UI of {uri}: tried {ports}")


def _holder(owner: int | None, uri: str) -> str:
    if owner is not None and owner != os.getuid():
        return f"another user's process (user id {owner}): no link will name it"
    return f"something other than an MLflow UI of {uri}"


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


def _bind(port: int) -> socket.socket | None:
    """A listening socket on 127.0.0.1:``port``, or None where something holds the port."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As the server binds: a port left in TIME_WAIT by a stopped UI counts as free.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
    except OSError:
        listener.close()
        return None
    return listener


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


def wait_served() -> None:
    """Until the server this process started ends (``serve_ui``'s terminal waits on it)."""
    with _lock:
        server = _server
    if server is not None:
        server.proc.wait()


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
    shutil.rmtree(server.folder, ignore_errors=True)  # the guard's own cleanup, if it was killed
    _remove_if_empty(server.log)


def _prune_logs(folder: Path) -> None:
    """The UI logs of processes that are gone (ours only; a live process's log stays)."""
    for path in folder.glob(f"{_LOG_PREFIX}*.log"):
        pid = path.name.removeprefix(_LOG_PREFIX).split("-", 1)[0]
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


def _spawn(uri: str, listener: socket.socket) -> _Server:
    port = listener.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="sgpu-mlflow-ui-", dir=_socket_parent()))  # 0700
    upstream = folder / "server.sock"
    env = dict(os.environ)
    # A viewer needs no background job runner (it would start a dozen more processes).
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    command = [
        sys.executable, "-m", "serverless_gpu.tracking.ui_guard",
        "--gate", str(listener.fileno()), str(upstream), "--",
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
        # Experiments the server creates (the default one, in a new store) keep their artifacts
        # where this process's own MLflow client puts them: with the server's proxied
        # "mlflow-artifacts:" default, runs logged from here could not store a single file.
        "--default-artifact-root", private.client_artifact_root(),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--uvicorn-opts", f"--uds {upstream}",
    ]  # fmt: skip
    try:
        log, out = _new_log()
        with out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(listener.fileno(),),
                start_new_session=True,  # a Ctrl-C meant for the notebook does not reach it
            )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return _Server(uri, f"http://127.0.0.1:{port}", proc, log, folder)


def _socket_parent() -> str:
    """The temp folder, or /tmp where its path is too long for a Unix socket's address."""
    parent = tempfile.gettempdir()
    return parent if len(os.fsencode(parent)) <= _SOCKET_PARENT_MAX else "/tmp"


def _new_log() -> tuple[Path, Any]:
    """A new log file of ours in the private runs root (never one someone else prepared)."""
    root = rundirs.runs_root()
    _prune_logs(root)
    log = root / f"{_LOG_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.log"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return log, open(os.open(log, flags, 0o600), "ab")


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
