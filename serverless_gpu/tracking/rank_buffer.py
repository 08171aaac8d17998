"""The rank side of fast logging: points kept in memory, sent to the caller in batches.

Appending to a deque is atomic under the GIL, so the user's threads never take a lock; one
flusher thread (started on the first point) drains the deques every ``flush_interval`` seconds
and the rank's exit callback drains what is left before the rank reports its result.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from serverless_gpu.tracking.settings import MESSAGE_KIND

Send = Callable[[str, Any], None]
MetricPoint = tuple[str, float, int, int]
"""``(key, value, timestamp_ms, step)``."""

_WAKE_AT = 5000
"""Points waiting before the flusher is woken early, to bound memory and message size."""
_MAX_PER_MESSAGE = 10000
_JOIN_S = 5.0


class RankBuffer:
    """Metrics, params and tags of one rank, on their way to the caller."""

    def __init__(self, run_id: str, flush_interval: float, send: Send) -> None:
        self.run_id = run_id
        self.active = True
        """False in a process forked from the rank (a DataLoader worker): its points would have
        no flusher, so it logs through plain MLflow instead."""
        self._interval = max(flush_interval, 0.01)
        self._send = send
        self._metrics: deque[MetricPoint] = deque()
        self._params: deque[tuple[str, str]] = deque()
        self._tags: deque[tuple[str, str]] = deque()
        self._wake = threading.Event()
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        os.register_at_fork(after_in_child=self._forked)

    # -- producers (any user thread) ------------------------------------------------------

    def add_metric(self, point: MetricPoint) -> None:
        self._metrics.append(point)
        if self._thread is None:
            self._start()
        elif len(self._metrics) >= _WAKE_AT:
            self._wake.set()

    def add_param(self, key: str, value: str) -> None:
        self._params.append((key, value))
        self._ensure_started()

    def add_tag(self, key: str, value: str) -> None:
        self._tags.append((key, value))
        self._ensure_started()

    # -- delivery ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Send everything buffered so far; batches leave in the order they were taken."""
        with self._send_lock:
            self._send_all()

    def flush_within(self, wait_s: float) -> None:
        """``flush``, unless another flush holds the sending for ``wait_s`` (it may be this
        thread's own, interrupted by the signal that calls this)."""
        if not self._send_lock.acquire(timeout=wait_s):
            return
        try:
            self._send_all()
        finally:
            self._send_lock.release()

    def _send_all(self) -> None:
        while batch := self._take():
            try:
                self._send(MESSAGE_KIND, batch)
            except OSError:
                return  # the launcher is gone and this rank is about to be stopped

    def close(self) -> None:
        """Stop the flusher and send the rest (the rank's exit callback)."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(_JOIN_S)
        self.flush()

    def _take(self) -> dict[str, list[Any]] | None:
        batch = {
            "metrics": _drain(self._metrics, _MAX_PER_MESSAGE),
            "params": _drain(self._params, _MAX_PER_MESSAGE),
            "tags": _drain(self._tags, _MAX_PER_MESSAGE),
        }
        return batch if any(batch.values()) else None

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._send_lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(
                target=self._loop, name="serverless-gpu-mlflow-flush", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            self.flush()

    def _forked(self) -> None:
        self.active = False


def _drain(items: deque[Any], limit: int) -> list[Any]:
    """Pop up to ``limit`` items; items appended meanwhile stay for the next batch."""
    out = []
    for _ in range(min(len(items), limit)):
        out.append(items.popleft())
    return out
