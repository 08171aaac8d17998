"""MLflow tracking: every ``.distributed()`` call is one MLflow run that all ranks log into.

Importing this package (done by ``serverless_gpu``) registers the run hook and never imports
mlflow; see ``docs/tracking.md``.
"""

from __future__ import annotations

import sys

from serverless_gpu.caller.hooks import register_hook
from serverless_gpu.tracking.errors import TrackingWarning
from serverless_gpu.tracking.hook import tracking_hook
from serverless_gpu.tracking.latest import LatestMetrics
from serverless_gpu.tracking.ui import stop_ui, ui

register_hook(tracking_hook, order=10)


def wait_written(timeout: float | None = None) -> bool:
    """Wait until the MLflow runs of this process's ended calls are complete in their store.

    A call returns with its results while its run's end (the last metrics, the ranks' logs,
    the closing tags, the status) is written behind it, within milliseconds on a local store.
    Call this before reading such a run right after its call (a script; a notebook's next cell
    comes later than that); the process's exit waits by itself. A store problem met meanwhile
    is warned about here. False if ``timeout`` (seconds) ran out first."""
    tracker = sys.modules.get("serverless_gpu.tracking.tracker")
    return True if tracker is None else bool(tracker.wait_written(timeout))


__all__ = ["LatestMetrics", "TrackingWarning", "stop_ui", "tracking_hook", "ui", "wait_written"]
