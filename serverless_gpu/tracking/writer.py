"""The one place that writes a run's data into MLflow: a thread in the caller.

Ranks never write metrics, params or tags to the store themselves: eight ranks fighting for an
SQLite write lock (or opening eight HTTP sessions) would make logging slow and fragile.
The writer merges queued batches into large ``log_batch`` calls, uploads the per-rank logs
periodically, and ends the run. After the first store error it stops writing for the run and
keeps everything else in the run directory (see :mod:`.spill`): the training never waits for,
nor fails because of, tracking.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from serverless_gpu.tracking import private
from serverless_gpu.tracking.spill import Spill
from serverless_gpu.wire.runpaths import LOG_GLOB, RunPaths

_MERGE_METRICS = 5000
"""Queued batches are merged into one write up to this many points."""
_WAIT_SLICE_S = 2.0
FIRST_WRITE_S = 0.5
"""How long the writer lets a call run before its first write (unless the call ends first): a
quick call's writes then all come behind it instead of taking the caller's CPU (and the
GIL) while it runs; a longer one shows its params this much later."""
STALL_S = 30.0
"""At the end of a call, how long one request to a server may go unanswered before the rest
goes to the run directory (a server that answers its health check may still hang on the API)."""


@dataclass(frozen=True)
class _Op:
    kind: str
    """``setup``, ``batch``, ``system``, ``logs``, ``task``, ``finish`` or ``stop``."""
    rank: int | None = None
    time: float = 0.0
    data: Any = None


_STOP = _Op("stop")
_LOGS = _Op("logs")
_DATA_KINDS = ("setup", "batch", "system")


class Writer:
    """Writes one run's data in arrival order, from its own thread."""

    def __init__(
        self,
        client: MlflowClient,
        run_id: str,
        logs_dir: Path,
        spill: Spill,
        upload_every: float,
        known_params: dict[str, str],
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.logs_dir = logs_dir
        self.spill = spill
        self.failure: BaseException | None = None
        """The store error that stopped tracking for this run, if any."""
        self.private_artifacts: Path | None = None
        """The run's artifact folder when it is on this machine: uploaded logs are made private."""
        self.conflicts: list[str] = []
        """Params that ranks logged with a value other than the one already recorded."""
        self._upload_every = upload_every
        self._params = dict(known_params)
        self._written = set(known_params)
        self._system_step = 0
        self._after_end: list[Callable[[], object]] = []
        self._queue: queue.SimpleQueue[_Op] = queue.SimpleQueue()
        self._pending: _Op | None = None
        self._busy_since: float | None = None
        """When the request in flight started (None: none is)."""
        self._lock = threading.Lock()
        self._sending: list[_Op] = []
        """The ops of the request in flight: kept at once if tracking gives up meanwhile."""
        self._kept_early: list[_Op] = []
        """In-flight ops kept by ``give_up`` (the failed request must not keep them again)."""
        self._ended = threading.Event()
        """Set when the run's end is queued (or tracking gave up): no more holding back."""
        self._thread = threading.Thread(
            target=self._loop, name="serverless-gpu-mlflow", daemon=True
        )
        self._thread.start()

    # -- producers (the caller's waiting thread) ----------------------------------------------

    def setup(self, params: dict[str, str], tags: dict[str, str]) -> None:
        self._queue.put(_Op("setup", None, time.time(), {"params": params, "tags": tags}))

    def batch(self, rank: int, when: float, data: dict[str, Any]) -> None:
        self._queue.put(_Op("batch", rank, when, data))

    def system(self, when: float, values: dict[str, float]) -> None:
        self._queue.put(_Op("system", None, when, values))

    def run_later(self, task: Callable[[], object]) -> None:
        """Housekeeping in the writer's thread, off the caller's path; its errors are ignored."""
        self._queue.put(_Op("task", None, time.time(), task))

    def after_end(self, task: Callable[[], object]) -> None:
        """Housekeeping to run once the run's end is written; its errors are ignored."""
        self._after_end.append(task)

    def finish(self, status: str, tags: dict[str, str]) -> None:
        self._queue.put(_Op("finish", None, time.time(), {"status": status, "tags": tags}))
        for task in self._after_end:
            self.run_later(task)
        self._queue.put(_STOP)
        self._ended.set()

    def wait(
        self, still_reachable: Callable[[], bool] | None, timeout: float | None = None
    ) -> bool:
        """Until everything is written, or until a server stops answering: its health check,
        or one request for ``STALL_S`` (it may answer ``/health`` and hang on the API).
        False if ``timeout`` ran out first (the writing goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread.is_alive():
            left = _WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            self._thread.join(min(left, _WAIT_SLICE_S))
            if not self._thread.is_alive() or still_reachable is None:
                continue
            if not still_reachable():
                self.give_up(ConnectionError("the tracking server stopped answering"))
                return True
            busy_since = self._busy_since
            if busy_since is not None and time.monotonic() - busy_since > STALL_S:
                self.give_up(TimeoutError(f"the tracking server did not answer in {STALL_S:g} s"))
                return True
        return True

    @property
    def done(self) -> bool:
        """Everything is written (or kept in the run directory): the thread has ended."""
        return not self._thread.is_alive()

    def give_up(self, reason: BaseException) -> None:
        """Stop writing now; what is queued, and what the request in flight carries (it may
        never return), goes to the run directory."""
        self._fail(reason)
        with self._lock:
            sending = [op for op in self._sending if not any(op is k for k in self._kept_early)]
            self._kept_early += sending
        for op in sending:
            self._spill(op)
        while True:
            try:
                op = self._queue.get_nowait()
            except queue.Empty:
                break
            self._keep(op)
        self._queue.put(_STOP)  # the thread ends once its current request returns
        self._ended.set()

    # -- the writer thread --------------------------------------------------------------------

    def _loop(self) -> None:
        self._ended.wait(FIRST_WRITE_S)
        next_upload = time.monotonic() + self._upload_every
        while True:
            op = self._next(next_upload - time.monotonic() if self._upload_every > 0 else None)
            if op is _STOP:
                return
            if op is _LOGS:
                next_upload = time.monotonic() + self._upload_every
            self._busy_since = time.monotonic()
            self._apply(op)
            self._busy_since = None
            with self._lock:  # written or kept: a later give_up must not keep it again
                self._sending = []

    def _next(self, timeout: float | None) -> _Op:
        if self._pending is not None:
            op, self._pending = self._pending, None
            return op
        try:
            return self._queue.get(timeout=None if timeout is None else max(timeout, 0.0))
        except queue.Empty:
            return _LOGS

    def _apply(self, op: _Op) -> None:
        if self.failure is not None:
            self._keep(op)
            return
        if op.kind == "task":
            try:
                op.data()
            except Exception:
                pass  # housekeeping of other runs must not stop this one's tracking
            return
        try:
            with self._lock:
                self._sending = [op] if op.kind in _DATA_KINDS else []
            if op.kind == "batch":
                self._write_batches(op)
            elif op.kind == "setup":
                params = self._new_params(list(op.data["params"].items()), None)
                self._log(params, list(op.data["tags"].items()), [])
            elif op.kind == "system":
                self._write_system(op)
            elif op.kind == "logs":
                self._upload_logs()
            elif op.kind == "finish":
                self._upload_logs()
                self._upload_stacks()
                self._log([], list(op.data["tags"].items()), [])
                self.client.set_terminated(self.run_id, op.data["status"])
        except Exception as exc:  # any store error (MLflow, HTTP, SQL, disk) ends tracking only
            self._fail(exc)
            self._keep(op)

    def _write_batches(self, first: _Op) -> None:
        """This batch and those queued behind it, in one write."""
        ops = self._merge(first)
        with self._lock:
            self._sending = list(ops)
        params: list[tuple[str, str]] = []
        tags: list[tuple[str, str]] = []
        metrics: list[Metric] = []
        for op in ops:
            params += self._new_params(op.data["params"], op.rank)
            tags += op.data["tags"]
            metrics += [Metric(k, v, ts, step) for k, v, ts, step in op.data["metrics"]]
        try:
            self._log(params, tags, metrics)
        except Exception:
            for op in ops[1:]:
                self._keep(op)  # the first one is kept by _apply
            raise

    def _merge(self, first: _Op) -> list[_Op]:
        ops = [first]
        count = len(first.data["metrics"])
        while count < _MERGE_METRICS:
            try:
                op = self._queue.get_nowait()
            except queue.Empty:
                break
            if op.kind != "batch":
                self._pending = op
                break
            ops.append(op)
            count += len(op.data["metrics"])
        return ops

    def _new_params(self, pairs: list[tuple[str, str]], rank: int | None) -> list[tuple[str, str]]:
        """Params not recorded yet. Ranks log the same hyperparameters; a different value is
        reported (MLflow refuses to change a param), ours on a resumed run is left as it was."""
        new = []
        for key, value in pairs:
            known = self._params.setdefault(key, value)
            if known == value and key not in self._written:
                new.append((key, value))
                self._written.add(key)
            elif known != value and rank is not None:
                self.conflicts.append(f"{key}={value!r} from rank {rank} (kept {known!r})")
        return new

    def _log(
        self, params: list[tuple[str, str]], tags: list[tuple[str, str]], metrics: list[Metric]
    ) -> None:
        if params or tags or metrics:
            self.client.log_batch(
                self.run_id,
                metrics=metrics,
                params=[Param(k, v) for k, v in params],
                tags=[RunTag(k, v) for k, v in tags],
            )

    def _write_system(self, op: _Op) -> None:
        ts = int(op.time * 1000)
        step = self._system_step
        self._system_step += 1
        metrics = [Metric(k, float(v), ts, step) for k, v in op.data.items()]
        self._log([], [], metrics)

    def _upload_logs(self) -> None:
        for path in sorted(self.logs_dir.glob(LOG_GLOB)):
            self.client.log_artifact(self.run_id, str(path), "logs")
            if self.private_artifacts is not None:
                private.make_private(self.private_artifacts / "logs" / path.name)

    def _upload_stacks(self) -> None:
        """Stacks taken during the run (a timeout takes them before stopping the ranks)."""
        folder = RunPaths(self.logs_dir.parent).stacks_dir
        for path in sorted(folder.glob(LOG_GLOB)):
            self.client.log_artifact(self.run_id, str(path), folder.name)
            if self.private_artifacts is not None:
                private.make_private(self.private_artifacts / folder.name / path.name)

    # -- failure --------------------------------------------------------------------------------

    def _fail(self, reason: BaseException) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = reason

    def _keep(self, op: _Op) -> None:
        with self._lock:  # give_up may have kept it while its request was in flight
            if any(op is early for early in self._kept_early):
                return
        self._spill(op)

    def _spill(self, op: _Op) -> None:
        if op.kind in _DATA_KINDS:
            data = op.data if op.kind != "system" else {"metrics": op.data}
            self.spill.write(op.kind, op.rank, op.time, data)
