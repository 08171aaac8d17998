"""Where a run's end is handled when nobody waits on its handle: one background thread.

A run ends in the backend's reader thread, which must not block on tracking writes or file
copies (the other runs' events queue behind it). The end is handed here; a handle that a caller
is waiting on handles its own end in that caller's thread instead (``RunHandle``).

At the caller's exit the ends already handed over are seen through (bounded); ends that come
later (the runs the shutdown stops) are left to the exit handlers, as they always were.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable

_DRAIN_AT_EXIT_S = 10.0

_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_lock = threading.Lock()
_thread: threading.Thread | None = None
_closed = False


def submit(job: Callable[[], None]) -> None:
    """Run ``job`` in the background thread (started on first use); ignored once closed."""
    global _thread
    with _lock:
        if _closed:
            return
        if _thread is None:
            thread = threading.Thread(target=_work, name="serverless-gpu-finisher", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # the interpreter is shutting down: its exit handlers do it
                return
            _thread = thread
            # Registered now, after the backend's own exit handler: run first (atexit is LIFO).
            atexit.register(_drain, _DRAIN_AT_EXIT_S)
    _jobs.put(job)


def _work() -> None:
    while True:
        job = _jobs.get()
        try:
            job()
        except Exception:  # one run's bookkeeping must not stop the others' ends
            pass
        del job  # a dropped handle must not live on here until the next run ends


def _drain(timeout: float) -> None:
    """Close, then wait (up to ``timeout`` seconds) for the jobs handed over before."""
    global _closed
    with _lock:
        _closed = True
        running = _thread is not None and _thread.is_alive()
    if running:
        done = threading.Event()
        _jobs.put(done.set)
        done.wait(timeout)


def _after_fork_in_child() -> None:
    """The thread is the parent's; a child starts its own if it runs calls."""
    global _lock, _thread, _jobs, _closed
    _lock = threading.Lock()
    _thread = None
    _jobs = queue.SimpleQueue()
    _closed = False


os.register_at_fork(after_in_child=_after_fork_in_child)
