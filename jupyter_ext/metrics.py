"""The latest training metrics of a run as the widget's header shows them.

Which values are "the run's" is tracking's convention (:class:`LatestMetrics`: rank 0's metrics,
other ranks' go under ``rank_N/``); this only words them: ``step 120 · loss 0.4121 · lr 0.001``.
"""

from __future__ import annotations

from serverless_gpu.tracking import LatestMetrics

SHOWN = 4
"""Keys shown at most: loss-like keys first, then in the order they were first logged."""
DATA_BOUND = 0.2
"""From this mean share of time the ranks wait for their next batch, the header says the run
is data-bound."""


def _ordered(latest: LatestMetrics) -> list[str]:
    return sorted(latest.values, key=lambda key: "loss" not in key)


def key_metric(latest: LatestMetrics) -> str | None:
    """The metric the header's sparkline follows: the first loss-like one, else the first."""
    keys = _ordered(latest)
    return keys[0] if keys else None


def metrics_text(latest: LatestMetrics) -> str:
    """Empty before rank 0 logged a metric."""
    values = latest.values
    if not values:
        return ""
    keys = _ordered(latest)[:SHOWN]
    step = max(step for _value, step in values.values())
    shown = [f"{key} {values[key][0]:.4g}" for key in keys]
    return " \u00b7 ".join(([f"step {step}"] if step else []) + shown)


def data_wait_text(latest: LatestMetrics) -> str:
    """``waiting on data 38 % of the last minute, rank 1 slowest``; empty while the ranks'
    loaders wait less than :data:`DATA_BOUND` of the time (or log nothing)."""
    wait = latest.data_wait()
    if wait is None or wait.share < DATA_BOUND:
        return ""
    text = f"waiting on data {wait.share:.0%} of the last minute".replace("%", " %")
    return text + (f", rank {wait.slowest} slowest" if wait.ranks > 1 else "")
