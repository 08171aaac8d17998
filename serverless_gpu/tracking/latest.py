"""The latest metrics of a run, for renderers (the notebook widget's header): read from the
batches ranks send, which every subscriber receives, whether or not MLflow takes them."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from serverless_gpu.tracking.settings import MESSAGE_KIND
from serverless_gpu.wire.events import Event, RankMessage

DATA_WAIT = "dataloader/wait_fraction"
"""The share of a logging window a rank's training loop spent waiting for its next batch
(``serverless_gpu.data``'s loaders log it; rank N's arrives as ``rank_N/...``)."""
DATA_WAIT_WINDOW_S = 60.0
"""How far back :meth:`LatestMetrics.data_wait` looks from the newest point."""


class DataWait(NamedTuple):
    """Over the last :data:`DATA_WAIT_WINDOW_S` of loader windows: the ranks' mean share of
    time spent waiting on data, and the rank that waited most with its share."""

    share: float
    slowest: int
    slowest_share: float
    ranks: int


class LatestMetrics:
    """Rank 0's latest value and step of each metric it logged (other ranks' metrics are kept
    in MLflow under ``rank_N/``; a header shows the run's own numbers), and every rank's
    recent waits on data."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[float, int]] = {}
        """Metric name -> (value, step) of its last point."""
        self.waits: dict[int, deque[tuple[float, float]]] = {}
        """Rank -> (seconds since the epoch, share) of its loader's recent windows."""

    def update(self, event: Event) -> bool:
        """Take in one event; True if it brought rank 0 metrics."""
        if not (isinstance(event, RankMessage) and event.kind == MESSAGE_KIND):
            return False
        points = event.data.get("metrics") or ()
        self._take_waits(event.rank, points)
        if event.rank != 0:
            return False
        for key, value, _timestamp, step in points:
            self.values[key] = (float(value), int(step))
        return bool(points)

    def data_wait(self) -> DataWait | None:
        """None until a loader logged its waits."""
        newest = max((w[-1][0] for w in self.waits.values() if w), default=None)
        if newest is None:
            return None
        shares = {}
        for rank, points in self.waits.items():
            recent = [share for at, share in points if at >= newest - DATA_WAIT_WINDOW_S]
            if recent:
                shares[rank] = sum(recent) / len(recent)
        slowest = max(shares, key=lambda rank: (shares[rank], -rank))
        mean = sum(shares.values()) / len(shares)
        return DataWait(mean, slowest, shares[slowest], len(shares))

    def _take_waits(self, rank: int, points: Iterable[Sequence[Any]]) -> None:
        for key, value, timestamp, _step in points:
            if key == DATA_WAIT or key.endswith("/" + DATA_WAIT):
                waits = self.waits.setdefault(rank, deque(maxlen=64))
                waits.append((timestamp / 1000.0, float(value)))
