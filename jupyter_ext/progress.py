"""Where each rank's progress bar stands, and one line comparing the ranks.

A tqdm bar reads ``train:  40%|####      | 12/30 [00:03<00:04, 4.0it/s]``; any line with a
percentage and a ``n/total`` count is taken as a bar. With several ranks running bars, the
slowest and the fastest are named, so a straggler shows at a glance.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .ansi import strip_ansi

_PERCENT = re.compile(r"(?<![\d.])(\d{1,3})%")
_NUMBER = r"\d+(?:\.\d+)?[kMGT]?"
_COUNT = re.compile(rf"(?<![\w.])({_NUMBER})/({_NUMBER})(?![\w/])")
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@dataclass(frozen=True)
class Progress:
    percent: int
    count: str
    """``"12/30"`` as the bar prints it."""
    fraction: float
    """How far along, from the count (finer than the percentage on long bars)."""

    def __str__(self) -> str:
        return f"{self.percent}% ({self.count})"


def parse(line: str) -> Progress | None:
    """The bar's position, if ``line`` is a progress bar."""
    text = strip_ansi(line)
    percent, count = _PERCENT.search(text), _COUNT.search(text)
    if percent is None or count is None or int(percent.group(1)) > 100:
        return None
    done, total = _number(count.group(1)), _number(count.group(2))
    fraction = done / total if total else int(percent.group(1)) / 100
    return Progress(int(percent.group(1)), count.group(0), fraction)


def _number(text: str) -> float:
    scale = _SCALE.get(text[-1], 1.0)
    return float(text.rstrip("kMGT")) * scale


def merged_line(positions: Iterable[tuple[int, Progress]]) -> str:
    """``slowest rank 1 at 40% (12/30), fastest rank 0 at 67% (20/30)``; empty without bars."""
    ranked = sorted(positions, key=lambda item: (item[1].fraction, item[0]))
    if not ranked:
        return ""
    (slow_rank, slow), (fast_rank, fast) = ranked[0], ranked[-1]
    if len(ranked) == 1:
        return f"rank {slow_rank} at {slow}"
    if slow.fraction == fast.fraction:
        return f"{len(ranked)} ranks at {slow}"
    return f"slowest rank {slow_rank} at {slow}, fastest rank {fast_rank} at {fast}"
