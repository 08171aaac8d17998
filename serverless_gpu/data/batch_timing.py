"""Each rank's batch timing, logged to the call's MLflow run by
:class:`~serverless_gpu.data.DataLoader` and :class:`~serverless_gpu.data.VolumeDataLoader`.

Metrics (window means every :data:`LOG_INTERVAL_S` seconds and at the end of an iteration,
at the loader's batch count as step; rank N's under ``rank_N/`` like every metric a rank logs):

- ``dataloader/fetch_seconds``: time the training loop waited inside ``next()`` for a batch;
- ``dataloader/between_next_seconds``: time between two ``next()`` calls, the loop's own work;
- ``..._variance`` of each: the population variance over the same window;
- ``dataloader/wait_fraction``: the share of the window's time spent inside ``next()`` (the
  notebook widget's header says a run is data-bound from it).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Generator, Iterator
from typing import TypeVar

from serverless_gpu.common import settings
from serverless_gpu.tracking.latest import DATA_WAIT

__all__ = ["LOG_INTERVAL_S", "METRICS", "Delivered", "timed"]

LOG_INTERVAL_S = 10.0
FETCH = "dataloader/fetch_seconds"
BETWEEN = "dataloader/between_next_seconds"
WAIT_SHARE = DATA_WAIT
METRICS = (FETCH, f"{FETCH}_variance", BETWEEN, f"{BETWEEN}_variance", WAIT_SHARE)
"""The names the loaders log."""

T = TypeVar("T")


class Delivered:
    """The batches a loader handed to its loop over its life: the step of its metrics."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def timed(batches: Iterator[T], delivered: Delivered) -> Generator[T, None, None]:
    """Yield ``batches``, counting them in ``delivered`` and timing every ``next()`` and the
    loop's work between two, logged as the module docstring says with ``delivered.count`` as
    the step."""
    times = _BatchTimes()
    try:
        while True:
            asked = time.monotonic()
            try:
                value = next(batches)
            except StopIteration:
                return
            times.add(asked, time.monotonic())
            delivered.count += 1
            yield value
            times.log_if_due(delivered.count)
    finally:
        times.log(delivered.count)


class _BatchTimes:
    """Per-batch timings, logged as window means and variances, and the window's share of
    time spent waiting."""

    def __init__(self) -> None:
        self.fetch: list[float] = []
        self.between: list[float] = []
        self._last_return: float | None = None
        self._logged_at = time.monotonic()

    def add(self, asked: float, returned: float) -> None:
        self.fetch.append(returned - asked)
        if self._last_return is not None:
            self.between.append(asked - self._last_return)
        self._last_return = returned

    def log_if_due(self, step: int) -> None:
        if time.monotonic() - self._logged_at >= LOG_INTERVAL_S:
            self.log(step)

    def log(self, step: int) -> None:
        now = time.monotonic()
        window, self._logged_at = now - self._logged_at, now
        metrics: dict[str, float] = {}
        if self.fetch and window > 0:
            metrics[WAIT_SHARE] = min(1.0, math.fsum(self.fetch) / window)
        for name, values in ((FETCH, self.fetch), (BETWEEN, self.between)):
            if values:
                mean = math.fsum(values) / len(values)
                metrics[name] = mean
                # In floats: statistics.pvariance computes exactly, in fractions, 20 times slower.
                metrics[f"{name}_variance"] = math.fsum((v - mean) ** 2 for v in values) / len(
                    values
                )
                values.clear()
        if metrics:
            _log_metrics(metrics, step)


def _log_metrics(metrics: dict[str, float], step: int) -> None:
    """Into the call's run in a tracked rank, else into this process's active run, else
    nowhere. Timing never stops training: a failure is a warning."""
    if not settings.MLFLOW_RUN_ID.present():
        loaded = sys.modules.get("mlflow")
        if loaded is None or loaded.active_run() is None:
            return
    try:
        import mlflow

        mlflow.log_metrics(metrics, step=step)
    except Exception as exc:
        warnings.warn(f"DataLoader timing was not logged: {exc!r}", stacklevel=2)
