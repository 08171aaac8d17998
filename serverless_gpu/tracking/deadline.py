"""MLflow calls on the caller's critical path, bounded: a server that accepts connections but
never answers must cost the user seconds and one warning, not minutes of MLflow's retries."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from serverless_gpu.tracking.errors import TrackingUnavailableError

T = TypeVar("T")


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.lock = threading.Lock()


def call_with_deadline(
    fn: Callable[[], T],
    timeout: float,
    what: str,
    on_late: Callable[[T], None] | None = None,
) -> T:
    """``fn()`` in a daemon thread; :class:`TrackingUnavailableError` if it takes over ``timeout``.

    The thread cannot be stopped, so it runs on; if it succeeds after all, ``on_late`` gets its
    value (e.g. to end a run that nobody will write to).
    """
    outcome: _Outcome[T] = _Outcome()

    def target() -> None:
        try:
            value = fn()
        except BaseException as exc:  # handed to the waiting thread, or dropped when late
            outcome.error = exc
            outcome.done.set()
            return
        with outcome.lock:
            outcome.value = value
            outcome.done.set()
            late = outcome.abandoned
        if late and on_late is not None:
            try:
                on_late(value)
            except Exception:
                pass  # the server that hung is still unwell; the run stays as it is

    thread = threading.Thread(target=target, name="serverless-gpu-mlflow-start", daemon=True)
    thread.start()
    outcome.done.wait(timeout)
    with outcome.lock:
        if not outcome.done.is_set():
            outcome.abandoned = True
            raise TrackingUnavailableError(f"{what} did not answer within {timeout:g} s")
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]
