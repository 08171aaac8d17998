"""A metric's course as a small inline SVG line (a sparkline), and the points it is drawn from.

Plain SVG, no script: it draws the same in the live widget, in a saved notebook, nbviewer and
GitHub. The points are rank 0's, as the header's numbers are (:class:`LatestMetrics`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

from serverless_gpu.tracking import LatestMetrics
from serverless_gpu.wire.events import Event, RankMessage

KEEP_POINTS = 120
"""Points kept per metric: beyond it every other point is dropped (the line keeps its shape)."""
_FLAT = 1e-9
"""A course whose range is below this fraction of its values is a flat line."""
_LOWER_IS_BETTER = ("loss", "err", "mse", "mae", "perplexity", "ppl", "wer", "cer")


class MetricTrail(LatestMetrics):
    """Rank 0's latest value of each metric (as :class:`LatestMetrics`) and its recent course."""

    def __init__(self, keep: int = KEEP_POINTS) -> None:
        super().__init__()
        self.keep = keep
        self.history: dict[str, list[float]] = {}

    def update(self, event: Event) -> bool:
        if not super().update(event) or not isinstance(event, RankMessage):
            return False
        for key, value, _timestamp, _step in event.data.get("metrics") or ():
            trail = self.history.setdefault(key, [])
            trail.append(float(value))
            if len(trail) > 2 * self.keep:
                del trail[::2]
        return True


def key_metric(names: Iterable[str]) -> str:
    """The metric a table ranks trials by: the first loss-like one, else the first logged."""
    ordered = list(dict.fromkeys(names))
    losses = [name for name in ordered if "loss" in name.lower()]
    return (losses or ordered or [""])[0]


def lower_is_better(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _LOWER_IS_BETTER)


def best_index(values: Sequence[float | None], name: str) -> int | None:
    """Which of ``values`` is best for metric ``name`` (None when none is a number)."""
    found = [(v, i) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if not found:
        return None
    pick = min if lower_is_better(name) else max
    return pick(found)[1]


def sparkline_svg(
    values: Sequence[float],
    *,
    width: int = 80,
    height: int = 18,
    color: str = "#1f6feb",
    label: str = "",
) -> str:
    """``values`` as a line ``width`` x ``height`` px, its last point a dot; empty for none.
    ``label`` is the SVG's accessible name and tooltip. (``max-width:none``: JupyterLab's
    ``max-width:100%`` on an SVG would let a table column shrink below it.)"""
    points = [v for v in values if math.isfinite(v)]
    if not points:
        return ""
    low, high = min(points), max(points)
    span = high - low
    step = (width - 4) / max(1, len(points) - 1)
    if span <= _FLAT * max(abs(low), abs(high)):  # flat but for rounding: drawn flat
        xy = [(2 + i * step, height / 2) for i in range(len(points))]
    else:
        xy = [(2 + i * step, 2 + (height - 4) * (high - v) / span) for i, v in enumerate(points)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    last_x, last_y = xy[-1]
    title = html.escape(label)
    return (
        f'<svg class="sgpu-spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{title}" style="vertical-align:middle;max-width:none">'
        f"<title>{title}</title>"
        f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5" '
        f'stroke-linejoin="round"/>'
        f'<circle cx="{last_x:.1f}" cy="{last_y:.1f}" r="2" fill="{color}"/></svg>'
    )
