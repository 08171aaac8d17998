"""MLflow tracking: every ``.distributed()`` call is one MLflow run that all ranks log into.

Importing this package (done by ``serverless_gpu``) registers the run hook and never imports
mlflow; see ``docs/tracking.md``.
"""

from __future__ import annotations

from ..hooks import register_hook
from .errors import TrackingWarning
from .hook import tracking_hook
from .latest import LatestMetrics
from .ui import stop_ui, ui

register_hook(tracking_hook, order=10)

__all__ = ["LatestMetrics", "TrackingWarning", "stop_ui", "tracking_hook", "ui"]
