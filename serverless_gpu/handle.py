"""The caller's non-blocking handle on one run: wait, cancel, status, results, subscribers.

Events arrive from the backend's reader thread into a queue; they are dispatched to subscribers
in whichever thread waits on the handle, so renderers update from the caller's own thread.
"""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from . import stacks as _stacks
from .errors import WaitTimeoutError
from .events import (
    Event,
    OutputLines,
    RankFinished,
    RankStarted,
    RunFinished,
    RunQueued,
    RunScheduled,
    RunStarted,
    RunStatus,
    Subscriber,
)
from .hangs import HangWatch
from .hooks import RunContext
from .results import RunResult, failure_exception, load_results, with_root_cause
from .rundirs import release_run

R = TypeVar("R")
_STDERR_TAIL_LINES = 20
_SLICE_S = 0.05


class RunHandle(Generic[R]):
    """A run started with ``fn.start(...)``: it goes on while the caller does other things.

    * ``result(timeout=None)``: the ranks' return values (a :class:`RunResult`), or the
      root-cause exception raised; :class:`WaitTimeoutError` if ``timeout`` seconds pass first
      (the run goes on).
    * ``wait(timeout=None)``: True once the run has ended, False if ``timeout`` passed first.
    * ``done()``: whether it has ended, without waiting.
    * ``cancel()``: stop it (a queued run leaves the queue); returns at once; see its own
      docstring for ``stop_grace`` and ``force``.
    * ``status``: a :class:`RunStatus`: ``queued`` (waiting for devices other runs hold),
      ``pending`` (read "starting": devices allocated, ranks starting), ``running``,
      ``succeeded``, ``failed``, ``timed_out``, ``cancelled``.
    * ``devices``: the devices it was allocated (GPU entries or CPU slots), once it starts.
    * ``run_dir``, ``links`` (``links["mlflow"]`` when tracked), ``logs(rank)``.

    Events are dispatched to subscribers by whichever thread waits on (or polls) the handle.
    """

    def __init__(
        self,
        ctx: RunContext,
        cancel: Callable[[str, bool], None],
        take_stacks: Callable[[], None] | None = None,
    ) -> None:
        self.context = ctx
        self.run_id = ctx.run_id
        self.run_dir = ctx.run_dir
        self.status = RunStatus.PENDING
        self.devices: tuple[str, ...] = ()
        """The devices the launcher allocated to the run (empty while queued)."""
        self.ranks: dict[int, RankFinished] = {}
        self.finished: RunFinished | None = None
        self._cancel = cancel
        self._cancels = 0
        self._take_stacks = take_stacks
        self._hangs = HangWatch(ctx.run_id, ctx.config.hang_warning)
        self._started: set[int] = set()
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._subscribers: list[Subscriber] = []
        self._stderr: dict[int, deque[str]] = {}
        self._outcome: tuple[RunResult[R] | None, BaseException | None] | None = None
        self.load_values: Callable[[], list[Any]] | None = None
        """Where the backend keeps the ranks' values itself (Ray's object store); None: the
        result files of the run."""
        self.idle_callbacks = ctx.idle_callbacks
        self._dispatching = threading.RLock()
        """Events go to subscribers in one thread at a time, in order: the caller's waiting
        thread, or a notebook's background poll once the cell has returned."""
        ctx.set_canceller(self.cancel)
        ctx.set_stacks_taker(self.stacks)
        ctx.handle = self
        self.push(RunStarted.of(ctx.spec, time.time()))

    # -- feeding (backend thread) ----------------------------------------------------------

    def push(self, event: Event) -> None:
        self._queue.put(event)

    # -- consuming (caller thread) ---------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def poll(self) -> bool:
        """Dispatch every queued event; True once the run has finished."""
        with self._dispatching:
            while self.finished is None:
                try:
                    event = self._queue.get_nowait()
                except queue.Empty:
                    break
                self._dispatch(event)
        return self.finished is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run finishes (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.poll():
            remaining = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
            if remaining <= 0:
                return False
            with self._dispatching:
                try:
                    self._dispatch(self._queue.get(timeout=remaining))
                except queue.Empty:
                    pass
                self._check_hangs()
            for callback in self.idle_callbacks:
                callback()
        return True

    def _check_hangs(self) -> None:
        warning = self._hangs.check()
        if warning is not None:
            self._dispatch(warning)

    def done(self) -> bool:
        """Whether the run has ended (its result or failure is final); never waits."""
        return self.poll()

    @property
    def links(self) -> dict[str, str]:
        """Where to look at the run (``"mlflow"``: its MLflow page, when tracked)."""
        return self.context.links

    def logs(self, rank: int = 0) -> str:
        """What rank ``rank`` wrote to stdout and stderr so far (its log file)."""
        path = self.context.paths.log(rank)
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def cancel(self, reason: str = "cancelled by the user", *, force: bool = False) -> None:
        """Stop the run; returns at once. With ``stop_grace`` the first cancel asks the ranks
        to stop (``runtime.should_stop()``) and gives them that long to return; a second one
        (or ``force``) stops them at once (TERM, grace, KILL)."""
        if not self.poll():
            self._cancels += 1
            self._cancel(reason, force or self._cancels > 1)

    def stacks(self, timeout: float = _stacks.WAIT_S) -> dict[int, str]:
        """Every running rank's Python stacks (all threads, faulthandler's text), without
        stopping the run; also saved in the run directory (``RunPaths.stacks``). A rank
        that did not answer within ``timeout`` seconds is left out; a finished run gives the
        stacks saved last (a timeout saves them before stopping the ranks)."""
        self.poll()
        running = sorted(self._started - set(self.ranks))
        if self.finished is not None or not running or self._take_stacks is None:
            return _stacks.load_saved(self.context.paths, self.context.placement.world_size)
        return _stacks.take(self.context.paths, running, self._take_stacks, timeout)

    def result(self, timeout: float | None = None) -> RunResult[R]:
        """The ranks' return values in rank order, or the root-cause exception raised."""
        __tracebackhide__ = True  # IPython and pytest hide this frame in tracebacks
        if not self.wait(timeout):
            raise WaitTimeoutError(
                f"run {self.run_id} still running after waiting {timeout:g} s; it goes on "
                "(call result() again to keep waiting, or cancel() to stop it)",
                run_dir=self.run_dir,
            )
        if self._outcome is None:
            self._outcome = self._build_outcome()
        values, error = self._outcome
        if error is not None:
            # Raised afresh each time: a second result() call must not show the first's frames.
            raise error.with_traceback(None)
        assert values is not None
        return values

    # -- internals -------------------------------------------------------------------------

    def _dispatch(self, event: Event) -> None:
        self._hangs.seen(event)
        if isinstance(event, RankStarted):
            self._started.add(event.rank)
        if isinstance(event, OutputLines) and event.stream == "stderr":
            tail = self._stderr.setdefault(event.rank, deque(maxlen=_STDERR_TAIL_LINES))
            tail.extend(line for line in event.lines if line.endswith("\n"))
        elif isinstance(event, RankFinished):
            self.ranks[event.rank] = event
        elif isinstance(event, RunFinished):
            event = with_root_cause(event, self.context.paths)
            self.finished = event
            self.status = event.status
            if event.status is not RunStatus.SUCCEEDED:
                _drop_bulk_files(self.context)  # no results to load; nobody may ask for them
        elif isinstance(event, RunQueued):
            self.status = RunStatus.QUEUED
        elif isinstance(event, RunScheduled):
            self.status = RunStatus.PENDING
            self.devices = event.devices
            self.context.metadata["devices"] = event.devices
        elif self.status is RunStatus.PENDING and isinstance(event, RankStarted | OutputLines):
            self.status = RunStatus.RUNNING
        for subscriber in self._subscribers:
            subscriber(event)

    def _build_outcome(self) -> tuple[RunResult[R] | None, BaseException | None]:
        finished = self.finished
        assert finished is not None
        ctx = self.context
        try:
            if finished.status is not RunStatus.SUCCEEDED:
                tails = {r: "".join(lines) for r, lines in self._stderr.items()}
                return None, failure_exception(finished, self.ranks, tails, ctx.paths, ctx.timeout)
            if self.load_values is not None:
                values: list[Any] = self.load_values()
            else:
                values = load_results(ctx.paths, ctx.placement.world_size)
            result: RunResult[R] = RunResult(
                values,
                run_id=ctx.run_id,
                run_dir=ctx.run_dir,
                links=ctx.links,
                metadata=ctx.metadata,
            )
            return result, None
        except Exception as exc:  # a broken result file must still end the call with an error
            return None, exc
        finally:
            _drop_bulk_files(ctx)


def _drop_bulk_files(ctx: RunContext) -> None:
    """Payload and result files can be GBs; logs and error records stay for the user."""
    paths = ctx.paths
    for path in paths.bulk_files():
        path.unlink(missing_ok=True)
    if paths.results_dir is not None:
        shutil.rmtree(paths.results_dir, ignore_errors=True)  # mapped results keep their pages
    release_run(paths.run_dir)  # the call is over: pruning may take its directory now
