"""What a renderer shows about one run, folded from the run's events.

Both renderers (widget and text) read this model; it keeps only the last ``max_lines`` finished
lines per rank (the full log is on disk), so memory and redraw cost stay bounded however much a
rank prints.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from serverless_gpu.events import (
    Event,
    OutputLines,
    RankFinished,
    RankStarted,
    RunFinished,
    RunStarted,
)
from serverless_gpu.hooks import RunContext

MAX_LINES_ENV = "SERVERLESS_GPU_WIDGET_LINES"
DEFAULT_MAX_LINES = 200


def max_lines_setting() -> int:
    value = os.environ.get(MAX_LINES_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_LINES


@dataclass
class RankView:
    rank: int
    max_lines: int
    state: str = "starting"
    """``starting``, ``running``, ``done``, ``failed`` or ``killed``."""
    pid: int | None = None
    started: float | None = None
    finished: float | None = None
    detail: str = ""
    """Why the rank ended, when it did not simply return."""
    result: str = ""
    """Type and shape of the rank's return value, when the caller reported it."""
    lines: deque[tuple[str, str]] = field(default_factory=deque)
    """The last finished lines as ``(stream, text)``, terminators removed."""
    provisional: dict[str, str] = field(default_factory=dict)
    """Per stream, the line being rewritten in place (a progress bar)."""
    line_count: int = 0
    version: int = 0
    """Bumped on every change, so renderers redraw only the ranks that changed."""

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=self.max_lines)

    def add_output(self, stream: str, pieces: tuple[str, ...]) -> None:
        for piece in pieces:
            if piece.endswith("\n"):
                self.lines.append((stream, piece[:-1]))
                self.line_count += 1
                self.provisional.pop(stream, None)
            elif piece.strip("\r"):
                self.provisional[stream] = piece.rstrip("\r")
        self.version += 1

    @property
    def dropped(self) -> int:
        """Finished lines no longer held here (they are in the log file)."""
        return self.line_count - len(self.lines)

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.finished or now) - self.started


class RunView:
    """The state of one run as the renderers draw it."""

    def __init__(self, ctx: RunContext, max_lines: int | None = None) -> None:
        placement = ctx.placement
        self.run_id = ctx.run_id
        self.name = ctx.name
        self.world_size = placement.world_size
        self.device = placement.device
        names = sorted(set(placement.gpu_names))
        self.hardware = ", ".join(names) if names else placement.gpu_type.value
        self.run_dir: Path = ctx.run_dir
        self.links = ctx.links
        self.started = time.time()
        self.finished: float | None = None
        self.status = "starting"
        self.message = ""
        self.root_cause_rank: int | None = None
        limit = max_lines if max_lines is not None else max_lines_setting()
        self.ranks = [RankView(r, limit) for r in range(self.world_size)]

    def apply(self, event: Event | object) -> bool:
        """Fold one event in; False for event types this renderer does not know."""
        if isinstance(event, RunStarted):
            self.started = event.time
            self.status = "running"
        elif isinstance(event, RankStarted):
            self._rank_started(event)
        elif isinstance(event, OutputLines):
            self.ranks[event.rank].add_output(event.stream, event.lines)
        elif isinstance(event, RankFinished):
            self._rank_finished(event)
        elif isinstance(event, RunFinished):
            self._run_finished(event)
        else:
            return False
        return True

    def _rank_started(self, event: RankStarted) -> None:
        rank = self.ranks[event.rank]
        rank.state, rank.pid, rank.started = "running", event.pid, event.time
        rank.version += 1

    def _rank_finished(self, event: RankFinished) -> None:
        rank = self.ranks[event.rank]
        rank.state = event.state.value
        rank.finished = event.time
        if event.summary:
            rank.detail = event.summary
        elif event.state.value != "done":
            rank.detail = event.signal_name or f"exit code {event.exit_code}"
        rank.provisional.clear()
        rank.version += 1

    def _run_finished(self, event: RunFinished) -> None:
        self.status = event.status.value
        self.finished = event.time
        self.message = event.message
        self.root_cause_rank = event.root_cause_rank
        if event.root_cause_rank is not None and event.message:
            root = self.ranks[event.root_cause_rank]
            root.detail = event.message
            root.version += 1

    @property
    def done(self) -> bool:
        return self.finished is not None

    def elapsed(self, now: float | None = None) -> float:
        end = self.finished if self.finished is not None else (now or time.time())
        return max(0.0, end - self.started)

    def log_path(self, rank: int) -> Path:
        return self.run_dir / "logs" / f"rank_{rank}.txt"

    def set_results(self, descriptions: list[str]) -> None:
        for rank, text in zip(self.ranks, descriptions, strict=False):
            rank.result = text
            rank.version += 1

    def set_error(self, rank: int, text: str) -> None:
        self.ranks[rank].detail = text
        self.ranks[rank].version += 1
