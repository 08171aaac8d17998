"""Inside a rank: the graceful stop request, its callbacks, heartbeats and the attempt number.

The launcher asks a rank to stop with :data:`stacks.SIG_STOP`; the rank's doctor thread takes
it (the signal is blocked everywhere else), so the request is seen while the main thread is
busy in C. Callbacks registered with :func:`on_stop` run in the main thread at its next safe
point: the next call of :func:`should_stop` or :func:`heartbeat` (put one between steps).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from serverless_gpu.common import settings
from serverless_gpu.rank import runtime

HEARTBEAT_KIND = "serverless_gpu.heartbeat"
_HEARTBEAT_EVERY_S = 1.0

_requested = threading.Event()
_callbacks: list[Callable[[], Any]] = []
_last_heartbeat = 0.0


def request() -> None:
    """The launcher asked this rank to stop (called by the doctor thread)."""
    _requested.set()


def reset() -> None:
    """A new call starts in this process (a Ray rank actor serves one call after another): no
    stop asked for yet, no callback registered."""
    _requested.clear()
    _callbacks.clear()


def should_stop(sync: bool = False) -> bool:
    """True once the caller asked the run to stop (Cancel, timeout, interrupt, with
    ``stop_grace``): save what you need and return. A safe point: pending ``on_stop``
    callbacks run here first.

    With ``sync=True`` every rank of the initialized process group gets the same answer (one
    small all-reduce): the request reaches the ranks at slightly different steps, and a
    collective checkpoint (``dcp.save``) must start at the same step on every rank.
    """
    _run_callbacks()
    stop = _requested.is_set()
    if sync:
        stop = _agree(stop)
    return stop


def on_stop(callback: Callable[[], Any]) -> None:
    """Run ``callback`` in this rank's main thread at its next safe point after a stop
    request (a call of ``should_stop()`` or ``heartbeat()``). Runs once."""
    _callbacks.append(callback)
    if _requested.is_set() and threading.current_thread() is threading.main_thread():
        _run_callbacks()


def heartbeat() -> None:
    """Tell the caller this rank is alive (hang detection counts output, metrics and this);
    also a safe point for ``on_stop`` callbacks. Cheap: at most one message a second."""
    global _last_heartbeat
    _run_callbacks()
    now = time.monotonic()
    if now - _last_heartbeat < _HEARTBEAT_EVERY_S:
        return
    _last_heartbeat = now
    try:
        runtime.send_to_caller(HEARTBEAT_KIND, None)
    except RuntimeError:
        pass  # outside a distributed call: nobody listens


def attempt() -> int:
    """Which attempt of the call this is: 0 first, then 1, 2 ... with ``max_retries``."""
    return settings.ATTEMPT.read()


def _run_callbacks() -> None:
    if not _requested.is_set() or threading.current_thread() is not threading.main_thread():
        return
    while _callbacks:
        _callbacks.pop(0)()


def _agree(stop: bool) -> bool:
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return stop
    import torch

    where = torch.device("cpu") if runtime.is_cpu_mode() else runtime.device()
    flag = torch.tensor([1 if stop else 0], dtype=torch.int32, device=where)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
