"""What a renderer shows about one run, folded from the run's events.

Both renderers (widget and text) read this model; it keeps only the last ``max_lines`` finished
lines per rank (the full log is on disk), so memory and redraw cost stay bounded however much a
rank prints.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from serverless_gpu.caller.hangs import warning_text
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.common import settings
from serverless_gpu.common.errors import exit_words
from serverless_gpu.tracking import LatestMetrics
from serverless_gpu.wire.events import (
    Event,
    EventSubscriber,
    OutputLines,
    RankFinished,
    RankMessage,
    RanksSilent,
    RankStarted,
    RankState,
    RunFinished,
    RunStarted,
    RunStatus,
    RunWaiting,
)

from . import progress
from .metrics import key_metric
from .progress import Progress

METRIC_POINTS = 200
"""Values of the key metric the header's sparkline draws at most (the newest)."""


class RankShown(str, enum.Enum):
    """A rank's state as the renderers show it: the launcher's ``RankState``, and
    ``CANCELLED`` for a rank the library stopped because the user cancelled the run (the
    launcher reports it as ``STOPPED``). In lifecycle order."""

    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"

    @classmethod
    def of(cls, state: RankState) -> RankShown:
        return cls(state.value)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class RankView:
    rank: int
    max_lines: int
    state: RankShown = RankShown.STARTING
    pid: int | None = None
    node: str = ""
    """Where the rank runs when that is not this machine (``node 1 (10.0.0.7)``, Ray)."""
    started: float | None = None
    finished: float | None = None
    detail: str = ""
    """Why the rank ended, when it did not simply return: ``ValueError: bad value``,
    ``exited with code 3``, ``rank 1 failed``."""
    result: str = ""
    """Type and shape of the rank's return value, when the caller reported it."""
    lines: deque[tuple[str, str]] = field(default_factory=deque)
    """The last finished lines as ``(stream, text)``, terminators removed."""
    provisional: dict[str, str] = field(default_factory=dict)
    """Per stream, the line being rewritten in place (a progress bar)."""
    line_count: int = 0
    bar: str = ""
    """The progress bar as the rank drew it last: kept once the rank ended (a cancel or a
    timeout clears the line being rewritten), so the record says how far the rank got."""
    version: int = 0
    """Bumped on every change, so renderers redraw only the ranks that changed."""

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=self.max_lines)

    def add_output(self, stream: str, pieces: tuple[str, ...]) -> None:
        for piece in pieces:
            if "%" in piece and progress.parse(piece) is not None:
                self.bar = piece.rstrip("\r\n").rsplit("\r", 1)[-1]
            if piece.endswith("\n"):
                self.lines.append((stream, piece[:-1]))
                self.line_count += 1
                self.provisional.pop(stream, None)
            elif piece.strip("\r"):
                self.provisional[stream] = piece.rstrip("\r")
        self.version += 1

    def last_line(self) -> str:
        """The line being rewritten (a progress bar), else the last finished line."""
        for text in reversed(list(self.provisional.values())):
            return text
        return self.lines[-1][1] if self.lines else ""

    def progress(self) -> progress.Progress | None:
        """Where the rank's progress bar stands (a bar being redrawn, or one just finished)."""
        for text in (*self.provisional.values(), self.lines[-1][1] if self.lines else ""):
            found = progress.parse(text)
            if found is not None:
                return found
        return None

    def last_progress(self) -> Progress | None:
        """Where the rank's bar stood last, also after the rank ended (for the record)."""
        return progress.parse(self.bar) if self.bar else None

    @property
    def dropped(self) -> int:
        """Finished lines no longer held here (they are in the log file)."""
        return self.line_count - len(self.lines)

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.finished or now) - self.started


@dataclass
class StacksTaken:
    """What the Stacks button found, kept in the view so that the record shows it too."""

    taken: float
    texts: dict[int, str | None]
    """Per rank: its stacks (faulthandler's text, main thread first), or None: no answer."""
    lines: dict[int, str]
    """Per rank: where it is, in one line (``in all_reduce ← Cell In[7], line 16``)."""
    verdict: str = ""
    """Which rank keeps the others waiting, where the stacks or the flight recorder say."""


_INTERRUPTED = (RankShown.STOPPED, RankShown.STARTING, RankShown.RUNNING)
"""States the end of a run turns into its stop reason (unless the rank is the root cause)."""
STARTING_PHASES = ("MLflow run", "launcher", "ranks")
"""What a run waits for before its ranks run, in order (the header says which)."""


class RunView(EventSubscriber):
    """The state of one run as the renderers draw it: the events folded in (:meth:`apply`)."""

    def __init__(self, ctx: RunContext, max_lines: int | None = None) -> None:
        placement = ctx.placement
        self.run_id = ctx.run_id
        self.name = ctx.name
        self.world_size = placement.world_size
        self.device = placement.device
        names = sorted(set(placement.gpu_names))
        self.hardware = ", ".join(names) if names else placement.gpu_type.value
        self.paths = ctx.paths
        self.run_dir: Path = ctx.run_dir
        self.links = ctx.links
        self.metadata = ctx.metadata
        """Shared with the run: tracking adds its store and run ids (the record's how-to-open)."""
        self.started = time.time()
        """When the view was made: renderers are made as the call starts, so the clock counts
        from the call, not from the ranks' start."""
        self.finished: float | None = None
        self.status = RunStatus.STARTING
        self.phase = STARTING_PHASES[0] if ctx.config.tracking else STARTING_PHASES[1]
        """While ``status`` is ``STARTING``: what the run waits for."""
        self.message = ""
        self.root_cause_rank: int | None = None
        limit = max_lines if max_lines is not None else settings.WIDGET_LINES.read()
        self.ranks = [RankView(r, limit) for r in range(self.world_size)]
        self.merged: deque[tuple[int, str]] = deque(maxlen=2 * limit)
        """Every rank's finished lines in arrival order, for the all-ranks view."""
        self.metrics = LatestMetrics()
        self.metric_history: deque[float] = deque(maxlen=METRIC_POINTS)
        """The key metric's values (:func:`metrics.key_metric`), oldest first: the sparkline."""
        self.stacks: StacksTaken | None = None
        """The stacks taken last with the Stacks button (None: not taken)."""
        self.hang_warning = ""
        """The last silent-ranks warning given in this run (kept in the record)."""
        self.waited = ""
        """What the run waited for last before its ranks started (a Ray cluster that had to
        grow; kept in the record)."""
        self.version = 0
        """Bumped on every change to any rank."""

    def apply(self, event: Event) -> bool:
        """Fold one event in; False for events that change nothing shown here."""
        before = self.version
        self(event)
        return self.version != before

    def on_run_started(self, event: RunStarted) -> None:
        self.phase = STARTING_PHASES[2]
        self.version += 1

    def on_rank_started(self, event: RankStarted) -> None:
        rank = self.ranks[event.rank]
        rank.state, rank.pid, rank.started = RankShown.RUNNING, event.pid, event.time
        rank.node = event.node
        rank.version += 1
        self.status = RunStatus.RUNNING
        self.version += 1

    def on_output_lines(self, event: OutputLines) -> None:
        self.ranks[event.rank].add_output(event.stream, event.lines)
        self.merged.extend((event.rank, p[:-1]) for p in event.lines if p.endswith("\n"))
        self.version += 1

    def on_rank_message(self, event: RankMessage) -> None:
        if self.metrics.update(event):
            self._metric_point()
            self.version += 1

    def on_run_waiting(self, event: RunWaiting) -> None:
        if event.message:  # kept for the record; not a change the ranks' view shows
            self.waited = event.message

    def on_ranks_silent(self, event: RanksSilent) -> None:
        if event.ranks:
            self.hang_warning = warning_text(event)

    def _metric_point(self) -> None:
        key = key_metric(self.metrics)
        if key is not None:
            self.metric_history.append(self.metrics.values[key][0])

    def on_rank_finished(self, event: RankFinished) -> None:
        self.version += 1
        rank = self.ranks[event.rank]
        rank.finished = event.time
        rank.state = RankShown.of(event.state)
        if event.state is RankState.STOPPED:
            # The library stopped it (another rank failed, a timeout, a cancel), unless
            # RunFinished names this rank as the root cause; it says which.
            rank.detail = ""
        elif event.summary:
            rank.detail = event.summary
        elif event.state is not RankState.DONE and event.exit_code is not None:
            rank.detail = exit_words(event.exit_code)
        rank.provisional.clear()
        rank.version += 1

    def on_run_finished(self, event: RunFinished) -> None:
        self.version += 1
        self.status = event.status
        self.finished = event.time
        self.message = event.message
        self.root_cause_rank = event.root_cause_rank
        failed = {f.rank: f for f in event.failures}
        for rank in self.ranks:
            failure = failed.get(rank.rank)
            if failure is not None:  # the root cause, or a rank that failed after it
                rank.state, rank.detail = RankShown.FAILED, failure.detail or rank.detail
            elif rank.state in _INTERRUPTED:
                rank.state, rank.detail = self._stop_reason()
            rank.version += 1

    @property
    def nodes(self) -> list[str]:
        """The machines the ranks run on, when they are not this one."""
        return sorted({r.node for r in self.ranks if r.node})

    def failed_to_start(self, message: str) -> None:
        """The call raised before the run started; no event will come."""
        self.status, self.finished, self.message = RunStatus.FAILED, time.time(), message
        for rank in self.ranks:
            rank.state, rank.detail = RankShown.STOPPED, "the run did not start"
            rank.version += 1

    def _stop_reason(self) -> tuple[RankShown, str]:
        """State and detail of a rank the library stopped, in the words of the run's end."""
        if self.status is RunStatus.CANCELLED:
            return RankShown.CANCELLED, ""
        if self.status is RunStatus.TIMED_OUT:
            return RankShown.STOPPED, "the run timed out"
        if self.root_cause_rank is not None:
            return RankShown.STOPPED, f"rank {self.root_cause_rank} failed"
        return RankShown.STOPPED, "the run failed"

    @property
    def done(self) -> bool:
        return self.finished is not None

    def elapsed(self, now: float | None = None) -> float:
        end = self.finished if self.finished is not None else (now or time.time())
        return max(0.0, end - self.started)

    def log_path(self, rank: int) -> Path:
        return self.paths.log(rank)

    def set_results(self, descriptions: list[str]) -> None:
        for rank, text in zip(self.ranks, descriptions, strict=False):
            rank.result = text
            rank.version += 1

    def progress_line(self) -> str:
        """The slowest and fastest rank's progress bar (empty when no rank runs one)."""
        positions = [(r.rank, p) for r in self.ranks if (p := r.progress()) is not None]
        return progress.merged_line(positions)
