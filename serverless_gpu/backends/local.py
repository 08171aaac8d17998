"""The local backend: one launcher process per caller, ranks forked from it on this machine.

The caller never forks (it may hold a CUDA context). The launcher is started fresh with
``python -m serverless_gpu.launcher_process``, kept for the caller's life, restarted
transparently if it died, and stopped at exit. It dies with the caller even on SIGKILL: it
reads EOF on its socket.
The process and its socket are ``launcher_client.py``'s; this module routes runs and their
events, and watches each run's time and system metrics.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Any

from serverless_gpu.backends.launcher_client import LauncherClient, LauncherGone
from serverless_gpu.backends.registry import BackendPlugin
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.caller.system_metrics import SystemSampler
from serverless_gpu.common import settings
from serverless_gpu.common.errors import LauncherError, StorageError
from serverless_gpu.common.gpus import Placement, resolve_placement
from serverless_gpu.runfiles.rundirs import release_run, storage_hint
from serverless_gpu.wire.config import DistributedConfig
from serverless_gpu.wire.env import group_env
from serverless_gpu.wire.events import RunFinished, RunQueued, RunScheduled
from serverless_gpu.wire.protocol import CancelRun, Prewarm, TakeStacks
from serverless_gpu.wire.runpaths import RunPaths
from serverless_gpu.wire.runspec import RunSpec

OVERDUE_MARGIN_S = 15.0
"""A run still going this long after its timeout and grace means the launcher is stuck
(stopped, or a fault of ours): the caller kills it rather than wait forever."""
REACH_MARGIN_S = 120.0
"""Added to the watchdog's allowance until the launcher schedules the run: a fresh launcher
imports torch, a prewarm may ask it to import more, forks are slow on a loaded machine. None of
that is the call's time; from ``RunScheduled`` on only the timeout, the grace and
``OVERDUE_MARGIN_S`` count."""


class LocalBackend:
    """Runs ranks on this machine through a launcher process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launcher: LauncherClient | None = None
        self._handles: dict[str, RunHandle[Any]] = {}
        self._samplers: dict[str, SystemSampler] = {}
        self._resent: set[str] = set()
        self._watchdogs: dict[str, threading.Timer] = {}
        self._pid = os.getpid()
        _backends.add(self)
        atexit.register(self._shutdown_at_exit)

    def _shutdown_at_exit(self) -> None:
        # A forked child inherits this handler: its exit must not stop its parent's launcher.
        if os.getpid() == self._pid:
            self.shutdown()

    def _forget_after_fork(self) -> None:
        """In a forked child: the launcher, its runs and this object's locks are the parent's."""
        self._lock = threading.Lock()
        launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.forget()
        self._handles = {}
        self._samplers = {}
        self._resent = set()
        self._watchdogs = {}

    def _ensure_launcher(self) -> LauncherClient:
        with self._lock:
            if self._launcher is None or not self._launcher.alive():
                self._launcher = LauncherClient(self._route, self._launcher_exited)
            return self._launcher

    def _route(self, event: Any) -> None:
        handle = self._handles.get(getattr(event, "run_id", ""))
        if handle is None:
            return
        handle.push(event)
        if isinstance(event, RunQueued):  # its timeout counts from its start, not its wait
            self._stop_watchdog(event.run_id)
        elif isinstance(event, RunScheduled):  # the run's own time starts now
            self._stop_watchdog(event.run_id)
            self._start_watchdog(handle.context.spec)
        elif isinstance(event, RunFinished):
            self._handles.pop(event.run_id, None)
            self._resent.discard(event.run_id)
            self._run_over(event.run_id)

    def _start_sampler(self, spec: RunSpec, handle: RunHandle[Any]) -> None:
        env = spec.env  # what the ranks see
        every = settings.SYSTEM_METRICS_INTERVAL.read(env)
        if every <= 0:
            return
        sampler = SystemSampler(
            spec.run_id,
            spec.device,
            env.get("CUDA_VISIBLE_DEVICES"),
            spec.world_size,
            every,
            handle.push,
        )
        self._samplers[spec.run_id] = sampler
        sampler.start()

    def _run_over(self, run_id: str) -> None:
        """Stop what watches a run from this side: its system metrics and its watchdog."""
        sampler = self._samplers.pop(run_id, None)
        if sampler is not None:
            sampler.stop()
        self._stop_watchdog(run_id)

    def _stop_watchdog(self, run_id: str) -> None:
        watchdog = self._watchdogs.pop(run_id, None)
        if watchdog is not None:
            watchdog.cancel()

    def _start_watchdog(self, spec: RunSpec, reach: float = 0.0) -> None:
        if spec.timeout is None:
            return
        after = reach + spec.timeout + spec.stop_s + OVERDUE_MARGIN_S
        when = f"{after:g} s after it {'was sent' if reach else 'started'}"
        watchdog = threading.Timer(after, self._overdue, (spec.run_id, when))
        watchdog.daemon = True
        watchdog.name = "serverless-gpu-watchdog"
        self._watchdogs[spec.run_id] = watchdog
        watchdog.start()

    def _overdue(self, run_id: str, when: str) -> None:
        """The launcher did not end a run long after its timeout: it is stuck. Killing it ends
        its runs with this reason, its ranks by their parent-death signal and what they
        started through their process groups."""
        launcher = self._launcher
        if run_id not in self._handles or launcher is None:
            return
        with launcher.state_lock:
            holds = run_id in launcher.runs or run_id in launcher.unaccepted
        if holds:
            launcher.kill(f"it had not ended run {run_id} {when}")

    def _launcher_exited(self, launcher: LauncherClient, unaccepted: list[RunSpec]) -> None:
        """The launcher ended: runs it never accepted go to a fresh one (once); runs it was
        running end with a clear error."""
        failed = [r for r in launcher.runs if r in self._handles]
        for start in unaccepted:
            if start.run_id not in self._handles:
                continue
            if start.run_id not in self._resent and not launcher.stopped:
                self._resent.add(start.run_id)
                try:
                    self._send_start(start)
                    continue
                except LauncherError:
                    pass
            failed.append(start.run_id)
        if not failed:
            return
        message = (
            f"the launcher process {launcher.exit_description()}; its log: {launcher.log_path}"
        )
        for run_id in failed:
            handle = self._handles.pop(run_id, None)
            if handle is not None:
                handle.push(RunFinished.run_failed(run_id, message, (), time.time()))
            self._resent.discard(run_id)
            self._run_over(run_id)

    def _send_start(self, start: RunSpec) -> None:
        """Hand the run to a live launcher, starting a fresh one if the current one is exiting
        (a call made while it shuts down must not see it)."""
        reason = ""
        for _ in range(2):
            launcher = self._ensure_launcher()
            try:
                launcher.start_run(start)
                return
            except LauncherGone as exc:
                reason = str(exc)
        raise LauncherError(f"could not reach the launcher process: {reason}")

    def submit(self, context: RunContext, payload: bytes) -> RunHandle[Any]:
        spec = context.spec
        try:
            _write_payload(spec.paths, payload)
        except BaseException:
            release_run(spec.paths.run_dir)  # no call will end: pruning may take the directory
            raise

        def cancel(reason: str, force: bool) -> None:
            self._send_control(CancelRun(spec.run_id, reason, force))

        handle: RunHandle[Any] = RunHandle(
            context, cancel, lambda: self._send_control(TakeStacks(spec.run_id))
        )
        self._handles[spec.run_id] = handle
        # Registered before the launcher hears of the run, so that its RunFinished stops it.
        self._start_sampler(spec, handle)
        try:
            # Before the run can end, which cancels it; until the launcher schedules the run
            # (re-armed then), the time it takes to get there is allowed for too.
            self._start_watchdog(spec, reach=REACH_MARGIN_S)
            self._send_start(spec)
        except BaseException:
            self._handles.pop(spec.run_id, None)
            self._run_over(spec.run_id)
            spec.paths.payload.unlink(missing_ok=True)
            release_run(spec.paths.run_dir)
            raise
        return handle

    def _send_control(self, message: CancelRun | TakeStacks) -> None:
        launcher = self._launcher
        if launcher is not None:
            try:
                launcher.send(message)
            except OSError:
                pass  # the launcher is gone, and with it the ranks

    def start(self) -> None:
        self._ensure_launcher()

    def prewarm(
        self, placement: Placement, preload: tuple[str, ...] = (), warm_group: bool = True
    ) -> None:
        message = Prewarm(
            placement.device, placement.world_size, preload, group_env(dict(os.environ)), warm_group
        )
        try:
            self._ensure_launcher().send(message)
        except OSError:
            pass  # prewarming is an optimisation; the next call starts what it needs

    def shutdown(self) -> None:
        with self._lock:
            launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.stop()


def _write_payload(paths: RunPaths, payload: bytes) -> None:
    """The call's pickled function and arguments, for every rank to read; all or nothing."""
    path, run_dir = paths.payload, paths.run_dir
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
    except OSError as exc:
        path.unlink(missing_ok=True)  # a partial payload would keep the disk full
        raise StorageError.wrap(
            f"could not write the call's payload ({len(payload):,} bytes) to {run_dir}",
            exc,
            storage_hint(run_dir.parent, exc.errno),
            run_dir=run_dir,
        ) from exc


_backends: weakref.WeakSet[LocalBackend] = weakref.WeakSet()
_default: LocalBackend | None = None
_default_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()  # another thread may have held it at the fork
    for backend in list(_backends):
        backend._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def default_backend() -> LocalBackend:
    global _default
    with _default_lock:
        if _default is None:
            _default = LocalBackend()
        return _default


def stop_local_calls() -> None:
    """Stop the launcher and every rank it started, if this process started one."""
    with _default_lock:
        backend = _default
    if backend is not None:
        backend.shutdown()


def _placement(config: DistributedConfig) -> Placement:
    return resolve_placement(config.gpus, config.gpu_type, config.gpus_per_node)


PLUGIN = BackendPlugin(
    name="local",
    backend=lambda config: default_backend(),
    placement=_placement,
    shutdown=stop_local_calls,
    sessions=True,
    stacks=True,
    standby=True,
)
"""This machine's GPUs, ranks forked by a launcher process (the default backend)."""
