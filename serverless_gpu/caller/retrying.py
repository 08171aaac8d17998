"""A handle that follows one call across its attempts: ``fn.start`` and ``fn.map`` with
``max_retries``.

Each attempt is a run of its own (run directory, MLflow run, ``runtime.attempt()``) with its own
:class:`RunHandle`. When an attempt ends with a failure that ``retries.py`` retries, the next
attempt starts at once, in whichever thread dispatched the end (the caller's while it waits, the
finisher's while nobody does), and the handle the caller holds follows it: its status, waits,
cancel, links, logs and result are the current attempt's, and it is done only once the last
attempt has ended. A failure that is not retried, a cancel and a timeout end the call.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from serverless_gpu.caller import follow
from serverless_gpu.caller.handle import RunHandle
from serverless_gpu.caller.results import RunResult
from serverless_gpu.caller.retries import (
    Call,
    FailedAttempt,
    add_note,
    attempts_note,
    failed_attempt,
    retryable,
    say_retrying,
)
from serverless_gpu.caller.waits import deadline_of, logs_first, still_running
from serverless_gpu.common.errors import CancelledError
from serverless_gpu.doctor import stacks as _stacks
from serverless_gpu.wire.events import Event, RunFinished, RunStatus, Subscriber

R = TypeVar("R")

_RUN_FIELDS = frozenset(
    {"context", "run_id", "run_dir", "devices", "ranks", "finished", "load_values"}
)
"""The current attempt's attributes a caller reads on the handle as on any ``RunHandle``."""


class RetryingHandle(RunHandle[R]):
    """A :class:`RunHandle` whose run is started again (a new run) while its call may retry."""

    def __init__(
        self,
        call: Call,
        retry_on: tuple[type[BaseException] | str, ...],
        start: Callable[[Call], RunHandle[R]],
    ) -> None:
        # No RunHandle.__init__: its state is the current attempt's run's (``_RUN_FIELDS``).
        self._call, self._retry_on, self._start_run = call, retry_on, start
        self._deciding = threading.RLock()
        """Held while an attempt's end is judged and the next attempt started."""
        self._failed: list[FailedAttempt] = []
        self._subscribers: list[Subscriber] = []
        self._over = False
        """The current attempt is the call's last."""
        self._start_error: BaseException | None = None
        """The next attempt could not start: the call's error."""
        self._cancelled = False
        self._cancels = 0
        try:
            first = start(call)
        except BaseException:
            call.end("failed")  # a call that cannot start is over (tracking ends its run)
            raise
        self._current = self._follow(first)

    def __getattr__(self, name: str) -> Any:
        if name in _RUN_FIELDS:
            return getattr(self._current, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- following the attempts --------------------------------------------------------------

    def _follow(self, run: RunHandle[R]) -> RunHandle[R]:
        """Subscribe to an attempt: its end is judged as it is dispatched; the caller's
        subscribers get its events too. Weak: a dropped handle retries nothing."""
        me = weakref.ref(self)

        def on_event(event: Event) -> None:
            handle = me()
            if handle is not None and isinstance(event, RunFinished):
                handle._decide(run)

        run.subscribe(on_event)
        for subscriber in self._subscribers:
            run.subscribe(subscriber)
        return run

    def _decide(self, run: RunHandle[R]) -> None:
        """An attempt has ended (once dispatched): the call is over, or the next attempt
        starts. Idempotent; callers hold no attempt's locks except in its own dispatch."""
        with self._deciding:
            if run is not self._current or self._over:
                return
            finished = run.finished
            if finished is not None and finished.status is RunStatus.SUCCEEDED:
                self._end("succeeded")  # its results stay unloaded until someone reads them
                return
            error = _error_of(run)
            self._failed.append(failed_attempt(self._call.attempt, error))
            if self._is_last(error):
                if len(self._failed) > 1:
                    add_note(error, attempts_note(self._failed))
                self._end("cancelled" if isinstance(error, CancelledError) else "failed")
                return
            self._call.attempt += 1
            say_retrying(self._failed[-1], self._call)
            self._start_next()

    def _is_last(self, error: BaseException) -> bool:
        call = self._call
        return (
            self._cancelled
            or call.attempt >= call.max_retries
            or not retryable(error, self._retry_on)
        )

    def _start_next(self) -> None:
        try:
            self._current = self._follow(self._start_run(self._call))
        except Exception as exc:  # a call that cannot start again ends with that error
            add_note(exc, attempts_note(self._failed))
            self._start_error = exc
            self._end("failed")

    def _end(self, status: str) -> None:
        self._over = True
        self._call.end(status)

    def _settled(self, run: RunHandle[R]) -> bool:
        """Whether ``run``, which has ended, is the call's last (judged here if its
        dispatch did not judge it)."""
        self._decide(run)
        return run is self._current

    # -- the handle ------------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)
        self._current.subscribe(subscriber)

    def poll(self, blocking: bool = True) -> bool:
        """Dispatch the current attempt's events; True once the call's last attempt ended."""
        while True:
            run = self._current
            if not run.poll(blocking):
                return False
            if not blocking:  # its end may be being judged in another thread right now
                return self._over and run is self._current
            if self._settled(run):
                return True

    @property
    def status(self) -> RunStatus:
        """The current attempt's status; ``starting`` while the next attempt is starting."""
        run = self._current
        status = run.status
        if status.finished and not (self._over and run is self._current):
            return RunStatus.STARTING
        return status

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the call's last attempt ends (True) or ``timeout`` seconds pass."""
        deadline = deadline_of(timeout)
        while True:
            run = self._current
            if not run.wait(_left(deadline)):
                return False
            if self._settled(run):
                return True

    def done(self) -> bool:
        return self.poll()

    @property
    def links(self) -> dict[str, str]:
        return self._current.links

    def logs(self, rank: int = 0) -> str:
        return self._current.logs(rank)

    def cancel(self, reason: str = "cancelled by the user", *, force: bool = False) -> None:
        """Stop the current attempt and start no other; as ``RunHandle.cancel``."""
        with self._deciding:  # an attempt starting now is the one cancelled
            self._cancelled = True
            run = self._current
        if not self.poll(blocking=False):
            self._cancels += 1
            run.cancel(reason, force=force or self._cancels > 1)

    def stacks(self, timeout: float = _stacks.WAIT_S) -> dict[int, str]:
        return self._current.stacks(timeout)

    def result(self, timeout: float | None = None, logs: bool = False) -> RunResult[R]:
        """The last attempt's values, or its error (with every attempt's root cause);
        ``logs=True`` as for ``RunHandle.result``, across the attempts."""
        __tracebackhide__ = True
        timeout, logs = logs_first(timeout, logs)
        if logs:
            timeout = follow.followed(
                lambda: self.context.paths, self._current._subscribers, self.wait, timeout
            )
        deadline = deadline_of(timeout)
        while True:
            run = self._current
            if not run._wait_as_reader(_left(deadline)):
                raise still_running(run.run_id, timeout, run.run_dir)
            if self._settled(run):
                break
        if self._start_error is not None:
            raise self._start_error.with_traceback(None)
        return run.result(0)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _error_of(run: RunHandle[Any]) -> BaseException:
    """The error of an attempt that did not succeed (the one its ``result()`` raises)."""
    try:
        run.result(0)
    except Exception as exc:
        return exc
    raise AssertionError(f"run {run.run_id} ended {run.status.value} with a result")
