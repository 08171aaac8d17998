"""The Ray backend: a call's ranks are actors on the Ray cluster this process is connected to."""

from __future__ import annotations

import threading
from typing import Any

from serverless_gpu.backends.ray.connect import connect
from serverless_gpu.backends.ray.run import RayRun
from serverless_gpu.backends.ray.standby import Standby
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common.errors import SerializationError
from serverless_gpu.common.gpus import Placement

_JOIN_S = 10.0


class RayBackend:
    """Starts each call as a :class:`RayRun`; between calls, the actors of calls that
    succeeded wait for the next call of their shape (``standby.py``)."""

    def __init__(self) -> None:
        self._runs: dict[str, RayRun] = {}
        self._lock = threading.Lock()
        self.standby = Standby()

    def submit(self, context: RunContext, payload: bytes) -> RunHandle[Any]:
        connect()
        runs: list[RayRun] = []

        def cancel(reason: str, force: bool) -> None:
            runs[0].cancel(reason, force)

        def take_stacks() -> None:
            runs[0].request_stacks()

        handle: RunHandle[Any] = RunHandle(context, cancel, take_stacks=take_stacks)
        run = RayRun(context, payload, handle.push, self.standby)
        runs.append(run)
        if context.session_link is not None:  # a session's actors send their events there
            context.session_link.attach(run.deliver)
        handle.load_values = lambda: _values(run)
        with self._lock:
            self._runs = {k: v for k, v in self._runs.items() if v.thread.is_alive()}
            self._runs[context.run_id] = run
        run.start()
        return handle

    def start(self) -> None:
        """Nothing to start ahead: the cluster is Ray's."""

    def prewarm(
        self, placement: Placement, preload: tuple[str, ...] = (), warm_group: bool = True
    ) -> None:
        """Nothing to prepare ahead of the first call: its actors start with it (and stay
        for the next call of its shape)."""

    def shutdown(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            run.cancel("the caller shut down")
        for run in runs:
            run.thread.join(_JOIN_S)
        self.standby.release_all()


def _values(run: RayRun) -> list[Any]:
    for rank, exc in sorted(run.value_errors.items()):
        raise SerializationError.result_not_loaded(rank, exc, run_dir=run.ctx.run_dir) from exc
    return run.values


_default: RayBackend | None = None
_default_lock = threading.Lock()


def ray_backend() -> RayBackend:
    global _default
    with _default_lock:
        if _default is None:
            _default = RayBackend()
        return _default


def stop_ray_calls() -> None:
    """Cancel every call running on Ray from this process and release the standby actors
    (``serverless_gpu.shutdown``)."""
    with _default_lock:
        backend = _default
    if backend is not None:
        backend.shutdown()
