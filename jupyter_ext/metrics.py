"""The latest training metrics of a run (``step``, ``loss`` ...), for the widget's header.

Metrics logged in a rank with ``mlflow.log_metric`` reach the caller in batches (tracking's
``RankMessage``); this keeps the newest value of each key, taken from rank 0 as tracking's
convention records it (other ranks only where rank 0 logs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serverless_gpu.events import RankMessage
from serverless_gpu.tracking.settings import MESSAGE_KIND

SHOWN = 4
"""Keys shown at most; loss-like keys first, then the most recently logged."""


@dataclass
class LatestMetrics:
    values: dict[str, tuple[float, int, int]] = field(default_factory=dict)
    """key -> (value, step, order of arrival)."""
    rank: int | None = None
    """The rank whose metrics are shown."""
    step: int | None = None
    _arrivals: int = 0

    def apply(self, event: Any) -> bool:
        """Fold a metrics batch in; False for any other event."""
        if not (isinstance(event, RankMessage) and event.kind == MESSAGE_KIND):
            return False
        points = event.data.get("metrics", []) if isinstance(event.data, dict) else []
        if not points or (self.rank is not None and event.rank > self.rank):
            return bool(points)
        if self.rank is None or event.rank < self.rank:
            self.rank, self.values, self.step = event.rank, {}, None
        for key, value, _timestamp, step in points:
            self._arrivals += 1
            self.values[str(key)] = (float(value), int(step), self._arrivals)
            self.step = int(step) if self.step is None else max(self.step, int(step))
        return True

    def text(self) -> str:
        """``step 120 · loss 0.4121 · lr 0.001``; empty before any metric."""
        if not self.values:
            return ""
        keys = sorted(self.values, key=lambda k: ("loss" not in k, -self.values[k][2]))
        shown = [f"{key} {self.values[key][0]:.4g}" for key in keys[:SHOWN]]
        step = [f"step {self.step}"] if self.step else []
        return " \u00b7 ".join(step + shown)
