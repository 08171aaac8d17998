"""The latest metrics of a run, for renderers (the notebook widget's header): read from the
batches ranks send, which every subscriber receives, whether or not MLflow takes them."""

from __future__ import annotations

from serverless_gpu.tracking.settings import MESSAGE_KIND
from serverless_gpu.wire.events import Event, RankMessage


class LatestMetrics:
    """Rank 0's latest value and step of each metric it logged (other ranks' metrics are kept
    in MLflow under ``rank_N/``; a header shows the run's own numbers)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[float, int]] = {}
        """Metric name -> (value, step) of its last point."""

    def update(self, event: Event) -> bool:
        """Take in one event; True if it brought rank 0 metrics."""
        if not (isinstance(event, RankMessage) and event.kind == MESSAGE_KIND and event.rank == 0):
            return False
        points = event.data.get("metrics") or ()
        for key, value, _timestamp, step in points:
            self.values[key] = (float(value), int(step))
        return bool(points)
