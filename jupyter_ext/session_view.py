"""A session cell drawn as a call is: the run widget (every rank's output live, Cancel,
Stacks), replaced by a static record when the cell ends.

The cell is shown as a run of its own (named ``<session> In[<n>]``, the notebook's execution
count: the prompt and tracebacks use the same number) fed from the session's event stream while
the cell runs, begun and ended by events made here from the cell's outcome; the session's
console printer stays quiet meanwhile (the widget shows the lines).

A quick cell that succeeds and printed nothing reads as ``%%px`` does: its record is one status
line, the rank table folded under it; the ``Out[n:k]`` lines follow. Failures, cells that
printed, drew progress or ran long keep the full record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from serverless_gpu.api.session import Session
from serverless_gpu.caller.follow import muted
from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.caller.session import CellHandle
from serverless_gpu.common.describe import describe_value
from serverless_gpu.common.errors import CancelledError, failures_of, rank_of
from serverless_gpu.wire.events import (
    Event,
    EventSubscriber,
    RankFinished,
    RankStarted,
    RankState,
    RunFinished,
    RunStarted,
    RunStatus,
)

QUICK_S = 10.0
"""A successful cell that ran shorter than this, printing nothing, gets the folded record."""


def _renderer(ctx: RunContext, shell: Any) -> Any:
    from . import html_view
    from .widget import WidgetRenderer

    class CellRenderer(WidgetRenderer):
        compact = ""
        """The record's one line when the cell reads best folded (set as it succeeds)."""

        def _publish_record(self) -> None:
            if not self.compact or self.view.status is not RunStatus.SUCCEEDED:
                super()._publish_record()
                return
            full = html_view.record_html(self.view, label=self._label)
            self.record = html_view.folded_record_html(self.compact, full)
            if self._display is not None:
                bundle = {"text/html": self.record, "text/plain": self.compact}
                self._display.update(bundle, raw=True)

    return CellRenderer(ctx, shell)


class CellWidget(EventSubscriber):
    def __init__(self, shell: Any, session: Session, cell: CellHandle, count: int) -> None:
        run = session.core
        self.session = session
        self.handle = run.handle
        spec = replace(self.handle.context.spec, name=f"{session.name} In[{count}]")
        ctx = RunContext(spec)
        ctx.links.update(self.handle.context.links)
        ctx.metadata.update(self.handle.context.metadata)
        ctx.set_canceller(lambda *args, **kwargs: cell.cancel())
        ctx.set_stacks_taker(self.handle.stacks)
        self.ctx = ctx
        self.run_id = spec.run_id
        self.world = run.world
        self.renderer = _renderer(ctx, shell)
        now = time.time()
        self.renderer(RunStarted.of(spec, now))
        for rank in range(self.world):
            self.renderer(RankStarted(self.run_id, rank, run.pids.get(rank, 0), now))

    def on_output_lines(self, event: Event) -> None:
        """The cell's output, metrics and hang warnings go to its widget; its start and end are
        made here from the cell's outcome (the session's run goes on)."""
        self.renderer(event)

    on_rank_message = on_ranks_silent = on_output_lines

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        handle = self.handle
        handle.subscribe(self)
        ticks = self.ctx.idle_callbacks
        handle.idle_callbacks.extend(ticks)
        try:
            with muted(handle.subscribers):
                yield
        finally:
            handle.unsubscribe(self)
            for tick in ticks:
                handle.idle_callbacks.remove(tick)

    def quick(self, now: float) -> bool:
        """Whether the cell reads best folded: short, silent, no progress, no warning."""
        view = self.renderer.view
        silent = all(r.line_count == 0 and not r.bar for r in view.ranks)
        return silent and not view.hang_warning and now - view.started < QUICK_S

    def succeeded(self, values: list[Any]) -> None:
        now = time.time()
        if self.quick(now):
            took = f"{now - self.renderer.view.started:.1f} s"
            self.renderer.compact = (
                f"{self.ctx.name} succeeded in {took} \u00b7 {self.session.status_line()}"
            )
        for rank, value in enumerate(values):
            summary = describe_value(value)
            self.renderer(RankFinished(self.run_id, rank, RankState.DONE, None, None, now, summary))
        self.renderer(RunFinished.succeeded(self.run_id, now))
        self.renderer.show_results([describe_value(v) for v in values])

    def failed(self, exc: BaseException) -> None:
        now = time.time()
        failures = failures_of(exc)
        failed = {f.rank for f in failures}
        root = rank_of(exc)
        if root is not None:
            failed.add(root)
        cancelled = isinstance(exc, CancelledError)
        for rank in range(self.world):
            state = RankState.FAILED if rank in failed else RankState.DONE
            if cancelled:
                state = RankState.STOPPED
            self.renderer(RankFinished(self.run_id, rank, state, None, None, now, ""))
        if isinstance(exc, CancelledError) or not failures:
            status = RunStatus.CANCELLED if isinstance(exc, CancelledError) else RunStatus.FAILED
            finished = RunFinished.stopped(self.run_id, status, str(exc).splitlines()[0], (), now)
        else:
            finished = RunFinished.rank_failed(self.run_id, failures, (), now)
        self.renderer(finished)


def run_with_widget(shell: Any, session: Session, cell: CellHandle, count: int) -> Any:
    """Wait for ``cell`` (the notebook's ``In[count]``) with its widget drawn; its values (and
    whether its record is folded, saying the status), or its error raised."""
    __tracebackhide__ = True
    widget = CellWidget(shell, session, cell, count)
    with widget.following():
        try:
            result = cell.result()
        except BaseException as exc:
            widget.failed(exc)
            raise
    widget.succeeded(list(result))
    return result, bool(widget.renderer.compact)
