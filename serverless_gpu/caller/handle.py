"""The caller's non-blocking handle on one run: wait, cancel, status, results, subscribers.

Events arrive from the backend's reader thread into a queue; they are dispatched to subscribers
in whichever thread waits on the handle, so renderers update from the caller's own thread.

A run's end is the run's, not its reader's: when nobody waits in ``result()`` as it ends, the
finisher thread dispatches its events (tracking and ``run.json`` record the end), moves its
results from the tmpfs twin into the run directory and lets go of the run's descriptor. The
result is loaded once, under a lock, and every reader gets that same value or error.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from serverless_gpu.caller import call_fields, finisher
from serverless_gpu.caller.hangs import HangWatch
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.caller.results import (
    RunResult,
    failure_exception,
    load_results,
    with_root_cause,
)
from serverless_gpu.caller.run_cleanup import drop_bulk_files, spill_results
from serverless_gpu.caller.waits import (
    check_timeout,
    deadline_of,
    logs_first,
    read_log,
    still_running,
)
from serverless_gpu.doctor import stacks as _stacks
from serverless_gpu.wire.events import (
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

if TYPE_CHECKING:
    from serverless_gpu.caller.workloads import WorkloadMetadata

R = TypeVar("R")
_STDERR_TAIL_LINES = 20
_SLICE_S = 0.05
_LIVE: weakref.WeakValueDictionary[str, RunHandle[Any]] = weakref.WeakValueDictionary()
"""This process's handles by run id, for ``from_run_id`` (a dropped handle leaves it)."""


def _not_registered(run_id: str) -> RunHandle[Any]:
    raise RuntimeError("serverless_gpu.caller.reattach was not imported (the package face does)")


_reattach: Callable[[str], RunHandle[Any]] = _not_registered
"""What ``from_run_id`` calls: ``caller/reattach.py`` registers itself here when the package
face imports it (it builds handles of this class, so this module cannot import it)."""


def register_reattach(reattach: Callable[[str], RunHandle[Any]]) -> None:
    global _reattach
    _reattach = reattach


class RunHandle(call_fields.CallFields, Generic[R]):
    """A run started with ``fn.start(...)``: it goes on while the caller does other things.

    * ``result(timeout=None)``: the ranks' return values (a :class:`RunResult`), or the
      root-cause exception raised; :class:`WaitTimeoutError` if ``timeout`` seconds pass first
      (the run goes on).
    * ``wait(timeout=None)``: True once the run has ended, False if ``timeout`` passed first.
    * ``done()``: whether it has ended, without waiting.
    * ``cancel()``: stop it (a queued run leaves the queue); returns at once; see its own
      docstring for ``stop_grace`` and ``force``.
    * ``status``: a :class:`RunStatus`: ``queued`` (waiting for devices other runs hold),
      ``starting`` (devices allocated, ranks starting), ``running``,
      ``succeeded``, ``failed``, ``timed_out``, ``cancelled``.
    * ``devices``: the devices it was allocated (GPU entries or CPU slots), once it starts.
    * ``run_dir``, ``links`` (``links["mlflow"]`` when tracked), ``logs(rank)``.
    * the original's names: ``workload_metadata``, ``func_name``, ``gpus``, ``instance``,
      ``params``, ``exception``, ``start_time``, ``cleanup()``, ``from_run_id(run_id)``.

    Events are dispatched to subscribers by whichever thread waits on (or polls) the handle;
    those of a run that ends while no thread waits in ``result()``, by a background thread.
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
        self._status = RunStatus.STARTING
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
        self._subscribers: list[Subscriber] = list(ctx.subscribers)
        self._stderr: dict[int, deque[str]] = {}
        self._outcome: tuple[RunResult[R] | None, BaseException | None] | None = None
        self._loading = threading.Lock()
        """Held while the outcome is built and while the run's files are moved or dropped."""
        self._released = False
        """The run's bulk files are handled (dropped, or results spilled) and its run released."""
        self._readers = 0
        """Threads inside ``result()``: a run that ends while one waits is handled by it."""
        self._ended = False
        """The backend has pushed the run's end."""
        self._end_lock = threading.Lock()
        # A handle dropped unread takes its run's leftovers with it (not at exit: the backend's
        # shutdown owns the runs still going then).
        self._dropped = weakref.finalize(self, drop_bulk_files, ctx.paths, "dropped")
        self._dropped.atexit = False
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
        _LIVE[self.run_id] = self
        self.push(RunStarted.of(ctx.spec, time.time()))

    @classmethod
    def from_run_id(cls, run_id: str) -> RunHandle[Any]:
        """The handle of any run in the runs folder, by its id (or a unique prefix): this
        process's own handle for its runs; for a run of another kernel or of ``serverless-gpu
        run --detach``, one read from its run directory (status, ``logs``, ``links``, and
        ``result()`` once it has ended; see ``caller/reattach.py``)."""
        return _reattach(run_id)

    # -- feeding (backend thread) ----------------------------------------------------------

    def push(self, event: Event) -> None:
        self._queue.put(event)
        if isinstance(event, RunFinished):
            finisher.submit(self._on_end)

    def _on_end(self) -> None:
        """In the finisher thread: the run ended; a reader waiting in ``result()`` handles it."""
        with self._end_lock:
            self._ended = True
            if self._readers:
                return
        self._settle()

    def _settle(self) -> None:
        """Record the end (dispatch) and keep the results where no descriptor or tmpfs page is
        needed until they are read."""
        self.poll()
        with self._loading:
            if not self._released and self._outcome is None:
                self._released = spill_results(self.context.paths)

    # -- consuming (caller thread) ---------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop dispatching to ``subscriber`` (a session cell's widget once the cell ends)."""
        self._subscribers.remove(subscriber)

    @property
    def subscribers(self) -> list[Subscriber]:
        return list(self._subscribers)

    def poll(self, blocking: bool = True) -> bool:
        """Dispatch every queued event; True once the run has finished. Not ``blocking``: when
        another thread is dispatching, leave the events to it."""
        if not self._dispatching.acquire(blocking):
            return self.finished is not None
        try:
            while self.finished is None:
                try:
                    event = self._queue.get_nowait()
                except queue.Empty:
                    break
                self._dispatch(event)
        finally:
            self._dispatching.release()
        return self.finished is not None

    @property
    def status(self) -> RunStatus:
        """The run's status now (reading it dispatches the events that arrived)."""
        self.poll(blocking=False)
        return self._status

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run finishes (True) or ``timeout`` seconds pass (False)."""
        return self.wait_for(lambda: False, timeout)

    def wait_for(self, condition: Callable[[], bool], timeout: float | None = None) -> bool:
        """Dispatch events until ``condition()`` holds or the run finishes (True), or
        ``timeout`` seconds pass (False); a persistent session waits for its cells here."""
        deadline = deadline_of(timeout)
        while not self.poll() and not condition():
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
        return read_log(self.context.paths, rank)

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

    @property
    def workload_metadata(self) -> WorkloadMetadata:
        """The run's name, ranks, status, parameters and links, as a ``WorkloadMetadata``
        with the original API's field names."""
        from serverless_gpu.caller.workloads import metadata_of

        return metadata_of(self)

    def cleanup(self) -> None:
        """Nothing to do: the original API stops its environment-sync processes here; a run
        here has none, and its files are dropped once its result is read."""

    def result(self, timeout: float | None = None, logs: bool = False) -> RunResult[R]:
        """The ranks' return values in rank order, or the root-cause exception raised.
        ``logs=True`` prints every rank's log as it is written until then (``[rank N]`` first;
        the live output of ``output`` is held back meanwhile, so no line shows twice)."""
        __tracebackhide__ = True  # IPython and pytest hide this frame in tracebacks
        timeout, logs = logs_first(timeout, logs)
        if logs:
            # As a reader: the run's end is then handled here, its results read from the twin.
            from serverless_gpu.caller import follow

            timeout = follow.followed(
                lambda: self.context.paths, self._subscribers, self._wait_as_reader, timeout
            )
        if not self._wait_as_reader(timeout):
            raise still_running(self.run_id, timeout, self.run_dir)
        values, error = self._load_outcome()
        if error is not None:
            # Raised afresh each time: a second result() call must not show the first's frames.
            raise error.with_traceback(None)
        assert values is not None
        return values

    # -- internals -------------------------------------------------------------------------

    def _wait_as_reader(self, timeout: float | None) -> bool:
        """``wait``, as a reader: a run that ends meanwhile is handled here, in this thread
        (renderers print from it), unless the end came after the wait gave up."""
        check_timeout(timeout)
        with self._end_lock:
            self._readers += 1
        finished = False
        try:
            finished = self.wait(timeout)
            return finished
        finally:
            with self._end_lock:
                self._readers -= 1
                left_to_us = self._ended and not self._readers
            if left_to_us and not finished:  # the finisher skipped the end for the readers
                self._settle()

    def _load_outcome(self) -> tuple[RunResult[R] | None, BaseException | None]:
        """Built once: concurrent readers wait for the first, and all get its outcome."""
        with self._loading:
            if self._outcome is None:
                outcome = self._build_outcome()  # an interrupt here caches nothing, drops nothing
                self._outcome = outcome
                self._release()
            return self._outcome

    def _release(self) -> None:
        """The run's bulk files are of no more use: drop them and let pruning have the run."""
        self._released = True
        self._dropped.detach()
        drop_bulk_files(self.context.paths, "read")

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
            self._status = event.status
            if event.status is not RunStatus.SUCCEEDED:
                with self._loading:  # no results to load; nobody may ask for them
                    self._release()
        elif isinstance(event, RunQueued):
            self._status = RunStatus.QUEUED
        elif isinstance(event, RunScheduled):
            self._status = RunStatus.STARTING
            self.devices = event.devices
            self.context.metadata["devices"] = event.devices
        elif self._status is RunStatus.STARTING and isinstance(event, RankStarted | OutputLines):
            self._status = RunStatus.RUNNING
        for subscriber in self._subscribers:
            subscriber(event)

    def _build_outcome(self) -> tuple[RunResult[R] | None, BaseException | None]:
        finished = self.finished
        assert finished is not None
        ctx = self.context
        try:
            if finished.status is not RunStatus.SUCCEEDED:
                tails = {r: "".join(lines) for r, lines in self._stderr.items()}
                return None, failure_exception(
                    finished, self.ranks, tails, ctx.paths, ctx.timeout, self._started
                )
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


def live_handle(run_id: str) -> RunHandle[Any] | None:
    """This process's handle of the run ``run_id``, while someone holds it."""
    return _LIVE.get(run_id)
