"""The local backend: one launcher process per caller, ranks forked from it on this machine.

The caller never forks (it may hold a CUDA context). The launcher is started fresh with
``python -m serverless_gpu.launcher``, kept for the caller's life, restarted transparently if it
died, and stopped at exit. It dies with the caller even on SIGKILL: it reads EOF on its socket.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import serverless_gpu

from ..env import METRICS_INTERVAL_ENV
from ..errors import LauncherError
from ..events import RunFinished, RunStatus
from ..gpus import Placement
from ..handle import RunHandle
from ..protocol import CancelRun, Prewarm, Shutdown, StartRun
from ..rundirs import runs_root
from ..system_metrics import DEFAULT_INTERVAL_S, SystemSampler
from .base import RunRequest

_SHUTDOWN_WAIT_S = 3.0


class _LauncherProcess:
    """One running launcher and the thread that reads its events."""

    def __init__(self, on_message: Any, on_exit: Any) -> None:
        ours, theirs = socket.socketpair()
        self.log_path = runs_root() / f"launcher-{os.getpid()}.log"
        log = open(self.log_path, "ab")  # noqa: SIM115
        package_parent = str(Path(serverless_gpu.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        args = [sys.executable, "-m", "serverless_gpu.launcher", str(theirs.fileno())]
        # The parent-death signal fires when the *thread* that forked exits, so only the main
        # thread may ask for it; EOF on the socket covers every case anyway.
        if threading.current_thread() is threading.main_thread():
            args.append("--pdeathsig")
        try:
            self.proc = subprocess.Popen(
                args,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C goes to the caller, which decides
            )
        finally:
            theirs.close()
            log.close()
        self.conn = Connection(ours.detach())
        self.send_lock = threading.Lock()
        self._on_message = on_message
        self._on_exit = on_exit
        self.reader = threading.Thread(target=self._read, name="serverless-gpu-events", daemon=True)
        self.reader.start()

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.conn.closed

    def send(self, message: Any) -> None:
        with self.send_lock:
            self.conn.send(message)

    def _read(self) -> None:
        try:
            while True:
                self._on_message(self.conn.recv())
        except (EOFError, OSError):
            pass
        self._on_exit(self)

    def stop(self) -> None:
        try:
            self.send(Shutdown())
        except OSError:
            pass
        try:
            self.proc.wait(_SHUTDOWN_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()
        self.reader.join(timeout=1.0)


class LocalBackend:
    """Runs ranks on this machine through a launcher process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launcher: _LauncherProcess | None = None
        self._handles: dict[str, RunHandle[Any]] = {}
        self._samplers: dict[str, SystemSampler] = {}
        atexit.register(self.shutdown)

    def _ensure_launcher(self) -> _LauncherProcess:
        with self._lock:
            if self._launcher is None or not self._launcher.alive():
                self._launcher = _LauncherProcess(self._route, self._launcher_exited)
            return self._launcher

    def _route(self, event: Any) -> None:
        handle = self._handles.get(getattr(event, "run_id", ""))
        if handle is None:
            return
        handle.push(event)
        if isinstance(event, RunFinished):
            self._handles.pop(event.run_id, None)
            self._stop_sampler(event.run_id)

    def _start_sampler(self, handle: RunHandle[Any]) -> None:
        ctx = handle.context
        env = {**os.environ, **ctx.env}  # what the ranks see
        every = float(env.get(METRICS_INTERVAL_ENV, DEFAULT_INTERVAL_S))
        if every <= 0:
            return
        placement = ctx.placement
        sampler = SystemSampler(
            ctx.run_id,
            placement.device,
            env.get("CUDA_VISIBLE_DEVICES"),
            placement.world_size,
            every,
            handle.push,
        )
        self._samplers[ctx.run_id] = sampler
        sampler.start()

    def _stop_sampler(self, run_id: str) -> None:
        sampler = self._samplers.pop(run_id, None)
        if sampler is not None:
            sampler.stop()

    def _launcher_exited(self, launcher: _LauncherProcess) -> None:
        """The launcher died under running calls: end them with a clear error."""
        for run_id, handle in list(self._handles.items()):
            handle.push(
                RunFinished(
                    run_id,
                    RunStatus.FAILED,
                    None,
                    f"the launcher process exited (code {launcher.proc.poll()}); "
                    f"its log: {launcher.log_path}",
                    (),
                    time.time(),
                )
            )
            self._handles.pop(run_id, None)
            self._stop_sampler(run_id)

    def submit(self, request: RunRequest) -> RunHandle[Any]:
        ctx = request.context
        payload_path = ctx.run_dir / "payload.pkl"
        fd = os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(request.payload)
        launcher = self._ensure_launcher()
        handle: RunHandle[Any] = RunHandle(ctx, lambda reason: self._cancel(ctx.run_id, reason))
        self._handles[ctx.run_id] = handle
        # Registered before the launcher hears of the run, so that its RunFinished stops it.
        self._start_sampler(handle)
        placement = ctx.placement
        try:
            launcher.send(
                StartRun(
                    run_id=ctx.run_id,
                    name=ctx.name,
                    run_dir=ctx.run_dir,
                    results_dir=ctx.results_dir,
                    payload_path=payload_path,
                    world_size=placement.world_size,
                    device=placement.device,
                    gpu_type=placement.gpu_type.value,
                    gpu_names=placement.gpu_names,
                    env=request.env,
                    cwd=request.cwd,
                    sys_path=request.sys_path,
                    timeout=ctx.timeout,
                    grace=request.grace,
                    standby=bool(ctx.options.get("standby", True)),
                )
            )
        except OSError as exc:
            self._handles.pop(ctx.run_id, None)
            self._stop_sampler(ctx.run_id)
            raise LauncherError(f"could not reach the launcher process: {exc}") from exc
        return handle

    def _cancel(self, run_id: str, reason: str) -> None:
        launcher = self._launcher
        if launcher is not None:
            try:
                launcher.send(CancelRun(run_id, reason))
            except OSError:
                pass  # the launcher is gone, and with it the ranks

    def start(self) -> None:
        self._ensure_launcher()

    def prewarm(self, placement: Placement, preload: tuple[str, ...] = ()) -> None:
        try:
            self._ensure_launcher().send(Prewarm(placement.device, placement.world_size, preload))
        except OSError:
            pass  # prewarming is an optimisation; the next call starts what it needs

    def shutdown(self) -> None:
        with self._lock:
            launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.stop()


_default: LocalBackend | None = None
_default_lock = threading.Lock()


def default_backend() -> LocalBackend:
    global _default
    with _default_lock:
        if _default is None:
            _default = LocalBackend()
        return _default
