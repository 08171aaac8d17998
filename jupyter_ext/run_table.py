"""Runs started at once (``fn.map``, a sweep) as one table, one row per trial, with sortable
columns (``table_view.py`` draws them), a per-row Cancel, ``Cancel all``, and each trial's own
run widget on demand under the table.

The cell returns while the runs go on: a background thread polls the handles (which dispatches
their events to the per-run renderers and trackers, one thread at a time per handle) and redraws
the table. ipywidgets may be updated from any thread: a comm message is sent on the kernel's
IOPub thread. Clicks arrive as widget messages, handled by the kernel between cells (or by the
UI pump of a cell that waits on the runs); the poll thread acts on them, so every call on a
handle is made from that one thread.

Once every trial has ended (and at kernel shutdown) the table leaves its record in the cell's
output in place of the widget: static HTML and a text form, as a single run's widget does, so a
saved notebook, nbconvert and GitHub show every trial's parameters and outcome.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import ipywidgets as widgets
from IPython.display import DisplayHandle, display

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.wire.events import RunStatus

from . import html_view, table_view
from .sparkline import MetricTrail, key_metric
from .table_widget import TableWidget
from .widget import WidgetRenderer
from .widget_base import RunWidget, _close

POLL_S = 0.25
_MAX_POLL_S = 7 * 24 * 3600.0
"""A background poll ends after a week even if a run never reports its end."""
SHUTDOWN_WAIT_S = 5.0
"""At kernel shutdown, how long the table waits for its runs to report their end."""
CANCEL_REASON = "cancelled from the notebook table"
ORPHANED = "unfinished"
"""A trial's status in a record left at kernel shutdown before its run reported its end."""


class TrialRow:
    """One trial: its context, the renderer that folds its events, its metric trail."""

    def __init__(self, ctx: RunContext, renderer: WidgetRenderer) -> None:
        self.ctx = ctx
        self.renderer = renderer
        self.view = renderer.view
        self.metrics = MetricTrail()
        self.subscribed = False
        self.cancels_wanted = 0
        self.cancels_sent = 0
        self.outcome = ""
        """The result or error text, once the run has ended and it was read."""
        self.orphaned = False
        """The kernel shut down before the run reported its end."""

    @property
    def trial(self) -> int:
        return int(self.ctx.metadata.get("trial", 0))

    @property
    def handle(self) -> Any:
        return self.ctx.handle

    @property
    def finished(self) -> bool:
        return self.view.done

    def status(self) -> str:
        view, handle = self.view, self.handle
        if view.done:
            return view.status.value
        if self.orphaned:
            return ORPHANED
        if self.cancels_wanted:
            return "cancelling"
        if view.status is RunStatus.STARTING:
            queued = handle is not None and handle.status is RunStatus.QUEUED
            return RunStatus.QUEUED.value if queued else "starting"
        return view.status.value

    def times(self, now: float) -> tuple[float | None, float | None]:
        """Seconds from the call to the ranks' start (queue, MLflow run, launcher), and from
        then to the end."""
        view = self.view
        end = view.finished if view.finished is not None else now
        starts = [r.started for r in view.ranks if r.started is not None]
        if not starts:
            return max(0.0, end - view.started), None
        first = min(starts)
        return max(0.0, first - view.started), max(0.0, end - first)

    def line(self, metric: str, now: float) -> table_view.TrialLine:
        queued, ran = self.times(now)
        latest = self.metrics.values.get(metric) if metric else None
        history = tuple(self.metrics.history.get(metric, ())) if metric else ()
        return table_view.TrialLine(
            trial=self.trial,
            params=dict(self.ctx.metadata.get("params", {})),
            status=self.status(),
            finished=self.finished,
            queued=queued,
            ran=ran,
            metric=latest[0] if latest else None,
            history=history,
            outcome=self.outcome if self.finished else self._progress(),
            link=self.ctx.links.get("mlflow", ""),
        )

    def _progress(self) -> str:
        if self.orphaned:
            return "the kernel shut down before the run reported its end"
        return self.view.progress_line()

    # -- the poll thread ------------------------------------------------------------------

    def pump(self) -> None:
        """Dispatch the run's events; act on Cancel clicks; read the outcome once it ended."""
        handle = self.handle
        if handle is None:  # not started yet, or the call failed before its run started
            if self.view.done and not self.outcome:
                self.outcome = self.view.message
            return
        if not self.subscribed:
            handle.subscribe(self.metrics.update)
            self.subscribed = True
        while self.cancels_sent < self.cancels_wanted:
            self.cancels_sent += 1
            handle.cancel(CANCEL_REASON)  # a second click stops the ranks at once
        handle.poll()
        if self.view.done and not self.outcome:
            self.outcome = _outcome(handle)


def _outcome(handle: Any) -> str:
    """Rank 0's result (rounded), or why the run did not succeed."""
    finished = handle.finished
    if finished is None or finished.status is not RunStatus.SUCCEEDED:
        return finished.message if finished is not None else "ended"
    try:
        values = handle.result(0)
    except Exception as exc:  # a result that cannot be loaded reads as its error
        return table_view.short_value(f"{type(exc).__name__}: {exc}")
    shown = table_view.short_value(values[0]) if len(values) else "no result"
    return shown if len(values) <= 1 else f"{shown} (rank 0 of {len(values)})"


class RunTable:
    """The table of one cell's concurrent runs, kept up to date by a background poll."""

    def __init__(self, name: str = "", *, show: bool = True) -> None:
        self.name = name
        self.rows: list[TrialRow] = []
        self.parent_run_id = _active_mlflow_run_id()
        """The sweep's MLflow run (MLflow's active run when the first trial starts)."""
        self.record = ""
        """The ended table as static HTML (empty while a trial runs)."""
        self.open_trial: int | None = None
        self.table = TableWidget()
        self.table.on_msg(self._on_message)
        self.details = widgets.VBox([], _dom_classes=["sgpu-table-details"])
        self.widget = RunWidget(
            self.text, children=[self.table, self.details], _dom_classes=["sgpu-table"]
        )
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()
        self._pump_lock = threading.Lock()
        """One pump at a time: the poll thread's, or the kernel shutdown's."""
        self._thread: threading.Thread | None = None
        self._display: DisplayHandle | None = None
        if show:
            self._display = display(self.widget, display_id=True)

    def add(self, ctx: RunContext, renderer: WidgetRenderer) -> TrialRow:
        """A new trial's row; a retried trial's next attempt (the same call) takes the row of
        its failed attempt: one row per trial, showing its latest attempt."""
        row = TrialRow(ctx, renderer)
        with self._lock:
            earlier = [i for i, r in enumerate(self.rows) if r.ctx.call is ctx.call]
            if earlier:
                self.rows[earlier[0]] = row
            else:
                self.rows.append(row)
            if not self.name:
                self.name = ctx.name
        self.refresh()
        return row

    # -- what is drawn --------------------------------------------------------------------

    def _rows(self) -> list[TrialRow]:
        with self._lock:
            return list(self.rows)

    def state(self, *, details: bool = False) -> table_view.TableState:
        rows = self._rows()
        metric = key_metric(name for row in rows for name in row.metrics.values)
        now = time.time()
        return table_view.TableState(
            name=self.name,
            lines=tuple(row.line(metric, now) for row in rows),
            metric=metric,
            parent_link=self._parent_link(rows),
            details={row.trial: _trial_record(row) for row in rows} if details else {},
        )

    def _parent_link(self, rows: list[TrialRow]) -> str:
        """The sweep's run on the page its trials' links point at (the same MLflow UI)."""
        if self.parent_run_id is None:
            return ""
        for row in rows:
            link = row.ctx.links.get("mlflow", "")
            if "/runs/" in link:
                return f"{link.rsplit('/runs/', 1)[0]}/runs/{self.parent_run_id}"
        return ""

    def refresh(self) -> None:
        state = self.state()
        table = self.table
        values = {
            "html": table_view.table_html(state, live=True, open_trial=self.open_trial),
            "heading": table_view.heading_html(state),
            "ended": bool(state.lines) and state.ended,
            "announce": table_view.summary_text(state),
        }
        for name, value in values.items():
            if getattr(table, name) != value:
                setattr(table, name, value)

    def text(self) -> str:
        return table_view.table_text(self.state())

    # -- clicks (the kernel's shell thread, or a waiting cell's UI pump) -------------------

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        kind, trial = content.get("type"), content.get("trial")
        if kind == "cancel_all":
            self.cancel()
        elif kind == "cancel":
            self.cancel(trial)
        elif kind == "details":
            self.show_details(trial)

    def cancel(self, trial: int | None = None) -> None:
        """Cancel one trial (or every unfinished one); the poll thread sends it."""
        for row in [r for r in self._rows() if trial is None or r.trial == trial]:
            if not row.finished:
                row.cancels_wanted += 1
        if trial is None:
            self.table.cancelling_all = True
        self.refresh()
        self.follow()

    def show_details(self, trial: int | None) -> None:
        """Show that trial's run widget under the table (again: hide it)."""
        row = next((r for r in self.rows if r.trial == trial), None)
        if row is None or self.open_trial == trial:
            self.open_trial, children = None, []
        else:
            title = widgets.HTML(f"<b>trial {row.trial}</b>")
            self.open_trial, children = row.trial, [title, row.renderer.widget]
        self.details.children = children
        self.refresh()

    # -- the background poll --------------------------------------------------------------

    def follow(self) -> None:
        """Start the background poll (once); it ends when every run has ended."""
        with self._lock:
            if self.record or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(
                target=self._poll, name="serverless-gpu-table", daemon=True
            )
            self._thread.start()

    def _poll(self) -> None:
        deadline = time.monotonic() + _MAX_POLL_S
        while time.monotonic() < deadline and not self.record:
            if self.pump():
                self.finish()
                return
            time.sleep(POLL_S)

    def pump(self) -> bool:
        """One round: every run's events and clicks, then a redraw; True once all ended."""
        rows = self._rows()
        with self._pump_lock:
            for row in rows:
                row.pump()
        try:
            self.refresh()
        except Exception:  # a closed widget (cell cleared): nothing left to draw
            return True
        return bool(rows) and all(row.finished for row in rows)

    def finish(self) -> None:
        """Leave the record in the cell's output in place of the widget (once)."""
        with self._finish_lock:
            if self.record:
                return
            state = self.state(details=True)
            self.record = table_view.record_html(state)
            if self._display is not None:
                bundle = {"text/html": self.record, "text/plain": table_view.table_text(state)}
                self._display.update(bundle, raw=True)
                # Replaced by the record: its models, and every trial's, are shown nowhere now.
                _close(self.widget)
                for row in self._rows():
                    _close(row.renderer.widget)

    def shut_down(self, timeout: float = SHUTDOWN_WAIT_S) -> None:
        """The kernel is going away: wait (bounded) for the runs to report their end, then
        leave the record with what is known."""
        if self.record:
            return
        deadline = time.monotonic() + timeout
        while not self.record and time.monotonic() < deadline:
            if self.pump():
                break
            time.sleep(POLL_S / 5)
        for row in self._rows():
            row.orphaned = not row.finished
        self.finish()


def _trial_record(row: TrialRow) -> str:
    return row.renderer.record or html_view.record_html(row.view)


def _active_mlflow_run_id() -> str | None:
    """MLflow's active run in this thread, without importing MLflow where nobody did."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    try:
        run = mlflow.active_run()
    except Exception:  # a half-imported or broken MLflow: no parent to link
        return None
    return None if run is None else str(run.info.run_id)


def follow_handle(handle: Any) -> threading.Thread:
    """Keep one run's widget updating after its cell returned: poll it in the background until
    it ends (bounded by ``_MAX_POLL_S``)."""

    def poll() -> None:
        deadline = time.monotonic() + _MAX_POLL_S
        while time.monotonic() < deadline and not handle.poll():
            time.sleep(POLL_S)

    thread = threading.Thread(target=poll, name="serverless-gpu-follow", daemon=True)
    thread.start()
    return thread
