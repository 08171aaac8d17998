"""MLflow tracking: every ``.distributed()`` call is one MLflow run that all ranks log into.

Importing this package (done by ``serverless_gpu``) registers the run hook and never imports
mlflow; see ``docs/tracking.md``.
"""

from __future__ import annotations

from serverless_gpu.caller.hooks import register_hook
from serverless_gpu.tracking.errors import TrackingWarning
from serverless_gpu.tracking.hook import tracking_hook
from serverless_gpu.tracking.latest import LatestMetrics
from serverless_gpu.tracking.ui import stop_ui, ui

register_hook(tracking_hook, order=10)

__all__ = ["LatestMetrics", "TrackingWarning", "stop_ui", "tracking_hook", "ui"]
