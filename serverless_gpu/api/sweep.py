"""``sweep(fn, items)``: run a function once per parameter set, at most so many at once.

Every item is one call of ``fn`` (with the decorator's ``max_retries``, a crashed trial is
started again); the runs share the node's devices through the launcher's
allocation and queue. A failing trial does not stop the others: its exception takes its place in
the results. When the function is tracked and MLflow is installed, the sweep is one parent
MLflow run and each trial a child run whose params are its arguments.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Iterator, Sequence
from typing import Any

from serverless_gpu.api.completion import as_completed
from serverless_gpu.api.decorator import DistributedFunction
from serverless_gpu.caller.handle import RunHandle, check_timeout, deadline_of
from serverless_gpu.caller.results import RunResult
from serverless_gpu.common.errors import WaitTimeoutError


def sweep(
    fn: DistributedFunction[..., Any],
    items: Sequence[Any],
    max_concurrent: int | None = None,
    timeout: float | None = None,
) -> list[RunResult[Any] | BaseException]:
    """Run ``fn`` once per item and wait for all; one entry per item, in item order: the run's
    :class:`RunResult`, or the exception it raised (as ``asyncio.gather(...,
    return_exceptions=True)``). ``max_concurrent`` bounds the runs started at once (the
    launcher also queues runs until devices are free); ``timeout`` bounds the whole sweep:
    when it passes, unfinished trials are cancelled (their entry is a ``CancelledError``) and
    trials not started yet get a :class:`WaitTimeoutError`."""
    if max_concurrent is not None and max_concurrent < 1:
        raise ValueError(f"max_concurrent must be at least 1, not {max_concurrent!r}")
    check_timeout(timeout)
    items = list(items)
    limit = max_concurrent or len(items) or 1
    trials = _Trials(fn, items, limit, deadline_of(timeout))
    handles = trials.handles
    with _parent_run(fn) as parent:
        late: WaitTimeoutError | None = None
        try:
            trials.run()
        except WaitTimeoutError as exc:
            late = exc
        finally:
            for handle in handles.values():
                if not handle.done():
                    handle.cancel("the sweep stopped")
            for handle in handles.values():
                handle.wait(30.0)
        outcomes = [
            _outcome(handles[i]) if i in handles else WaitTimeoutError(f"not started: {late}")
            for i in range(len(items))
        ]
        if parent is not None:
            _summarise(parent, outcomes)
    return outcomes


class _Trials:
    """The sweep's trials, started in item order, never more than ``limit`` unfinished at
    once. Each item is one call: its handle starts a failed attempt again as ``.distributed()``
    would (the decorator's ``max_retries`` and ``retry_on``; ``retrying.py``) and is done once
    the last attempt has ended."""

    def __init__(
        self,
        fn: DistributedFunction[..., Any],
        items: list[Any],
        limit: int,
        deadline: float | None,
    ) -> None:
        self.fn, self.items, self.limit, self.deadline = fn, items, limit, deadline
        self.handles: dict[int, RunHandle[Any]] = {}
        """The handle of each item started."""
        self._running: set[RunHandle[Any]] = set()

    def run(self) -> None:
        for i in range(len(self.items)):
            while len(self._running) >= self.limit:
                self._reap()
            handle = self.fn.start_trial(i, self.items[i])
            self.handles[i] = handle
            self._running.add(handle)
        while self._running:
            self._reap()

    def _reap(self) -> None:
        """Wait for one unfinished trial to end (its last attempt)."""
        remaining = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        self._running.remove(next(as_completed(list(self._running), remaining)))


def _outcome(handle: RunHandle[Any]) -> RunResult[Any] | BaseException:
    try:
        return handle.result(0)
    except Exception as exc:
        return exc


@contextlib.contextmanager
def _parent_run(fn: DistributedFunction[..., Any]) -> Iterator[Any]:
    """An MLflow run the trials become children of (MLflow's active run is their parent)."""
    if not fn.config.tracking or importlib.util.find_spec("mlflow") is None:
        yield None
        return
    import mlflow

    name = getattr(fn.func, "__name__", "fn")
    nested = mlflow.active_run() is not None
    with mlflow.start_run(run_name=f"{name} sweep", nested=nested) as parent:
        yield parent


def _summarise(parent: Any, outcomes: list[RunResult[Any] | BaseException]) -> None:
    import mlflow

    failed = sum(isinstance(o, BaseException) for o in outcomes)
    mlflow.log_metrics(
        {
            "trials": len(outcomes),
            "trials_failed": failed,
            "trials_succeeded": len(outcomes) - failed,
        },
        run_id=parent.info.run_id,
    )
