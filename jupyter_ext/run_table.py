"""Runs started at once (``fn.map``, a sweep) as one table: trial, params, status, elapsed, result
or last metric, MLflow link, Cancel per run and Cancel all; each row expands to the run's usual
per-rank widget.

The cell returns while the runs go on: a background thread polls the handles (which dispatches
their events to the per-run widgets and trackers, one thread at a time per handle) and redraws
the table. ipywidgets may be updated from any thread: a comm message is sent on the kernel's
IOPub thread. Widget clicks (Cancel) are handled by the kernel between cells; the poller never
touches the kernel's shell socket (``uipoll.py`` does that, only in the main thread).
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as widgets
from IPython.display import display

from serverless_gpu.events import RankMessage, RunStatus
from serverless_gpu.hooks import RunContext

POLL_S = 0.25
_MAX_POLL_S = 7 * 24 * 3600.0
"""A background poll ends after a week even if a run never reports its end."""
_COLUMNS = ("trial", "params", "status", "elapsed", "result / last metric", "MLflow")
CANCEL_REASON = "cancelled from the notebook table"


class RunRow:
    """One run of the table."""

    def __init__(self, ctx: RunContext, ranks: widgets.Widget | None) -> None:
        self.ctx = ctx
        self.started = time.monotonic()
        self.ended: float | None = None
        self.last_metric = ""
        self.subscribed = False
        self.cells = [widgets.HTML() for _ in _COLUMNS]
        self.cancel_button = widgets.Button(description="Cancel", icon="stop")
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.line = widgets.HBox([*self.cells, self.cancel_button])
        self.details = widgets.Accordion(children=[ranks] if ranks is not None else [])
        if ranks is not None:
            self.details.set_title(0, "ranks")
            self.details.selected_index = None
        self.widget = widgets.VBox([self.line, self.details])

    def cancel(self) -> None:
        handle = self.ctx.handle
        if handle is not None:
            handle.cancel(CANCEL_REASON)

    def note(self, event: object) -> None:
        """Subscriber: keep the latest metric a rank sent (``mlflow.log_metric`` buffers)."""
        if isinstance(event, RankMessage) and isinstance(event.data, dict):
            metrics = event.data.get("metrics") or []
            last = metrics[-1] if isinstance(metrics, list) and metrics else None
            if isinstance(last, (tuple, list)) and len(last) >= 2:
                self.last_metric = f"{last[0]}={last[1]}"

    def status(self) -> RunStatus:
        handle = self.ctx.handle
        return RunStatus.PENDING if handle is None else handle.status

    def texts(self) -> list[str]:
        ctx, status = self.ctx, self.status()
        if status.finished and self.ended is None:
            self.ended = time.monotonic()
        elapsed = (self.ended or time.monotonic()) - self.started
        params = ", ".join(f"{k}={v}" for k, v in ctx.metadata.get("params", {}).items())
        link = ctx.links.get("mlflow")
        return [
            html.escape(str(ctx.metadata.get("trial", ""))),
            html.escape(params),
            "starting" if status is RunStatus.PENDING else status.value,
            f"{elapsed:.1f} s",
            html.escape(self._result() or self.last_metric),
            f'<a href="{html.escape(link)}" target="_blank">run</a>' if link else "",
        ]

    def _result(self) -> str:
        handle = self.ctx.handle
        if handle is None or handle.status is not RunStatus.SUCCEEDED:
            return "" if handle is None or handle.finished is None else handle.finished.message
        try:
            return repr(handle.result(0)[0])[:80]
        except Exception as exc:  # a result that cannot be loaded reads as its error
            return f"{type(exc).__name__}: {exc}"[:80]

    def refresh(self) -> None:
        for cell, text in zip(self.cells, self.texts(), strict=True):
            if cell.value != text:
                cell.value = text
        self.cancel_button.disabled = self.status().finished


class RunTable:
    """The table of one cell's concurrent runs, kept up to date by a background poll."""

    def __init__(self) -> None:
        self.rows: list[RunRow] = []
        self.cancel_all = widgets.Button(description="Cancel all", button_style="danger")
        self.cancel_all.on_click(lambda _b: self.cancel())
        head = widgets.HBox([widgets.HTML(f"<b>{c}</b>") for c in _COLUMNS])
        self.body = widgets.VBox([])
        self.widget = widgets.VBox([self.cancel_all, head, self.body], _dom_classes=["sgpu-table"])
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        display(self.widget)

    def add(self, ctx: RunContext, ranks: widgets.Widget | None) -> RunRow:
        row = RunRow(ctx, ranks)
        with self._lock:
            self.rows.append(row)
        self.body.children = [*self.body.children, row.widget]
        row.refresh()
        return row

    def cancel(self) -> None:
        for row in list(self.rows):
            row.cancel()

    def follow(self) -> None:
        """Start the background poll (once); it ends when every run has ended."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._poll, name="serverless-gpu-table", daemon=True
            )
            self._thread.start()

    def _poll(self) -> None:
        deadline = time.monotonic() + _MAX_POLL_S
        while time.monotonic() < deadline:
            with self._lock:
                rows = list(self.rows)
            for row in rows:
                handle = row.ctx.handle
                if handle is not None:
                    if not row.subscribed:
                        handle.subscribe(row.note)
                        row.subscribed = True
                    handle.poll()
                try:
                    row.refresh()
                except Exception:  # a closed widget (cell cleared): nothing left to draw
                    return
            if rows and all(r.status().finished for r in rows):
                return
            time.sleep(POLL_S)


def text_summary(table: RunTable) -> str:
    """The table as plain text (what a text-only client or a test reads)."""
    lines = [" | ".join(_COLUMNS)]
    for row in table.rows:
        lines.append(" | ".join(html.unescape(t) for t in row.texts()))
    return "\n".join(lines)


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
