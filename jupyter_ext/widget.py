"""The live run widget: header with status and links, Cancel, an all-ranks view and one tab per
rank; once the run ends, a static record in its place.

Events only update the :class:`RunView`; the widget is redrawn at most every
``min_interval`` seconds (and on state changes), so a rank printing 100,000 lines costs the
browser a few redraws per second of bounded size, and costs the rank nothing.

When the run ends the cell's output is replaced (same display id) by plain HTML with a text
form: header, per-rank table with each rank's last lines, result or error, log folder and
MLflow link. A widget needs its kernel to draw; the record is what a restarted kernel, a saved
notebook, nbviewer and GitHub show.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import urlsplit

import ipywidgets as widgets
from IPython.display import DisplayHandle, display

from serverless_gpu.caller.hooks import RunContext
from serverless_gpu.wire.events import Event, EventSubscriber, RanksSilent, RunFinished, RunWaiting

from . import html_view, stacks_view
from .formatting import snapshot_text, status_words
from .live_status import LiveStatus
from .live_text import LiveText
from .log_pane import LogPane
from .runstate import RunView
from .traceback_text import ipython_labeler
from .uipoll import UiPump
from .widget_base import RunWidget, _close

MIN_INTERVAL_S = 0.25
ADDRESS_WAIT_S = 10.0
"""How long a run's end waits for its MLflow UI's address (a port bound, a process started;
not the UI answering): the record written then links the run, also in a headless notebook."""
_HEADER_INTERVAL_S = 1.0
CANCEL_REASON = "cancelled from the notebook widget"
_UI_FAILED = "the MLflow UI did not start"
ALL_RANKS = "all ranks"


class WidgetRenderer(EventSubscriber):
    """Subscriber that draws one run into a widget displayed in the running cell."""

    def __init__(
        self,
        ctx: RunContext,
        shell: Any = None,
        *,
        show: bool = True,
        min_interval: float = MIN_INTERVAL_S,
    ) -> None:
        self.view = RunView(ctx)
        self.min_interval = min_interval
        self._cancel = ctx.cancel
        self._take_stacks = ctx.stacks
        self._stop_grace = float(ctx.config.stop_grace)
        self._cancel_clicks = 0
        self._stacks_pending = False
        self._cancel_pending = False
        self._in_tick = False
        ctx.idle_callbacks.append(self.tick)
        self._pump = UiPump(shell)
        self._label = ipython_labeler(shell)
        """Names a frame's file as IPython does (``Cell In[7]``) in the stacks shown."""
        self._note = ""
        self._status_said = ""
        self._drawn: dict[int, int] = {}
        self._last_draw = 0.0
        self._last_header = 0.0
        self.record = ""
        """The finished run as static HTML (empty while it runs)."""
        self._build()
        self._text = LiveText(self.view, shell, enabled=show)  # for frontends without widgets
        self._display: DisplayHandle | None = None
        if show:
            self._display = display(self.widget, display_id=True)

    def _build(self) -> None:
        view = self.view
        self.header = widgets.HTML(
            html_view.header_html(view), layout=widgets.Layout(flex="1 1 auto")
        )
        # No icons: an icon font's glyph would lead the button's accessible name (" Cancel").
        self.cancel_button = widgets.Button(
            description="Cancel", button_style="danger", tooltip="Stop every rank of this run"
        )
        self.cancel_button.on_click(self._on_cancel)
        self.stacks_button = widgets.Button(
            description="Stacks",
            tooltip="Show where every rank is now (its Python stacks) without stopping the run",
        )
        self.stacks_button.on_click(self._on_stacks)
        self.warning = widgets.HTML("")
        """The silent-ranks warning (hang detection); empty while every rank shows life."""
        self.mlflow_button = widgets.Button(
            description="Start MLflow UI",
            icon="external-link",
            tooltip="Start the MLflow UI for this run's store (in the background) and link the run",
            layout=widgets.Layout(display="none", width="auto"),
        )
        """Shown only when the UI, started as the run's link appears, did not come up."""
        self.mlflow_button.on_click(self._on_open_mlflow)
        self._mlflow_thread: threading.Thread | None = None
        self._mlflow_pending = ""
        """Why the MLflow link cannot be opened yet (the UI starts or failed); empty: it can."""
        self._mlflow_address = threading.Event()
        """Set once the UI's address is known (the link names it) or its start failed."""
        self._button_display: DisplayHandle | None = None
        """The MLflow button kept under the record of a run whose UI did not start."""
        self.rank_status = widgets.HTML(html_view.rank_status_html(view))
        self.stacks_summary = widgets.HTML("", _dom_classes=["sgpu-stacks-pane"])
        """One line per rank and a verdict, once the Stacks button took them (all-ranks view)."""
        self.live = LiveStatus()
        self.merged = LogPane("all", html_view.merged_lines_html(view))
        self.outputs = [
            LogPane(str(r.rank), html_view.rank_lines_html(view, r), view.log_path(r.rank))
            for r in view.ranks
        ]
        self.stack_boxes = [widgets.HTML("") for _ in view.ranks]
        """Each rank's stacks, above its output, once the Stacks button took them."""
        everything = widgets.VBox(
            [self.stacks_summary, self.rank_status, self.merged], _dom_classes=["sgpu-all"]
        )
        self.tabs = widgets.Tab(
            children=[
                everything,
                *(widgets.VBox(pair) for pair in zip(self.stack_boxes, self.outputs, strict=True)),
            ],
            titles=(ALL_RANKS, *(html_view.tab_title(r) for r in view.ranks)),
        )
        self._top = top = widgets.HBox(
            [
                self.header,
                self.mlflow_button,
                self.stacks_button,
                self.cancel_button,
            ],
            layout=widgets.Layout(justify_content="space-between", align_items="flex-start"),
        )
        self.widget = RunWidget(
            self.text,
            children=[top, self.live, self.warning, self.tabs],
            _dom_classes=["sgpu-run"],
        )

    # -- events and ticks (the waiting thread) --------------------------------------------

    def on_run_waiting(self, event: RunWaiting) -> None:  # a cluster that must grow first
        self.view(event)
        self.warning.value = stacks_view.hang_html(event.message) if event.message else ""
        if event.message:
            self.live.say(event.message)

    def on_ranks_silent(self, event: RanksSilent) -> None:
        self.view(event)
        self.warning.value = stacks_view.silent_html(event)
        if event.ranks:
            self.live.say(self.view.hang_warning)

    def on_run_started(self, event: Event) -> None:  # a state changed: redrawn at once
        if self.view.apply(event):
            self._refresh(force=True)

    def on_output_lines(self, event: Event) -> None:  # output, metrics: at most every interval
        if self.view.apply(event):
            self._refresh(force=False)

    on_rank_started = on_rank_finished = on_run_started
    on_rank_message = on_output_lines

    def on_run_finished(self, event: RunFinished) -> None:
        if self.view.apply(event):
            self._finish()

    def set_phase(self, phase: str) -> None:
        """What the run waits for while it starts (the hooks are done: the launcher next)."""
        self.view.phase = phase
        self._draw_header()

    def tick(self) -> None:
        """Idle callback: handle pending clicks, redraw if something is due."""
        if self.view.done:
            return
        self._in_tick = True
        try:
            self._pump.poll()
        finally:
            self._in_tick = False
        if self._cancel_pending:
            self._cancel_pending = False
            self._cancel(CANCEL_REASON)
        if self._stacks_pending:
            self._stacks_pending = False
            self._show_stacks()
        self._refresh(force=False)

    def _refresh(self, *, force: bool) -> None:
        self._text.refresh()
        now = time.monotonic()
        due = now - self._last_draw >= self.min_interval
        if force or (due and self._drawn.get(-1) != self.view.version):
            self._draw()
            return
        if now - self._last_header >= _HEADER_INTERVAL_S:
            self._draw_header()

    def _draw_header(self) -> None:
        self._last_header = time.monotonic()
        if self._mlflow_thread is None and self._tracked():
            self._start_mlflow_ui()
        self.header.value = html_view.header_html(
            self.view, note=self._note, pending=self._pending_links()
        )
        status = f"{self.view.name}: {self._note or status_words(self.view)}"
        if status != self._status_said:  # a change, not every clock tick: the region keeps
            self._status_said = status  # what was said since (stacks taken, a hang warning)
            self.live.say(status)

    def _tracked(self) -> bool:
        """Whether tracking made this run's MLflow link (and says in which store)."""
        return "mlflow" in self.view.links and "mlflow_tracking_uri" in self.view.metadata

    def _pending_links(self) -> dict[str, str] | None:
        return {"mlflow": self._mlflow_pending} if self._mlflow_pending else None

    def _dead_links(self) -> dict[str, str] | None:
        """The record's: a link whose UI did not start (one still starting is linked: its
        address is known, and it opens by the time anyone reads the record)."""
        dead = self._mlflow_pending == _UI_FAILED or not self._mlflow_address.is_set()
        return self._pending_links() if dead else None

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        self._draw_header()
        view = self.view
        if self._drawn.get(-1) != view.version:
            self._drawn[-1] = view.version
            self.rank_status.value = html_view.rank_status_html(view)
            self.merged.html = html_view.merged_lines_html(view)
        for rank, output in zip(view.ranks, self.outputs, strict=True):
            if self._drawn.get(rank.rank) != rank.version:
                self._drawn[rank.rank] = rank.version
                output.html = html_view.rank_lines_html(view, rank)
        titles = (ALL_RANKS, *(html_view.tab_title(r) for r in view.ranks))
        if tuple(self.tabs.titles) != titles:
            self.tabs.titles = titles

    def _finish(self) -> None:
        self._pump.close()
        self._note = ""
        self._draw()
        self.warning.value = ""
        for button in (self.cancel_button, self.stacks_button):
            button.disabled = True
            button.layout.display = "none"
        self._text.clear()
        self._publish_record()
        if self._display is not None:
            self._keep_mlflow_button()
            _close(self.widget)  # replaced by the record: its models are shown nowhere now

    def _keep_mlflow_button(self) -> None:
        """A UI that did not start keeps its button under the record while the kernel lives:
        pressed, it starts the UI and the record links the run."""
        if self.mlflow_button.layout.display == "none":
            return
        self._top.children = tuple(c for c in self._top.children if c is not self.mlflow_button)
        self.mlflow_button.description = "Start MLflow UI"
        self._button_display = display(self.mlflow_button, display_id=True)

    def _publish_record(self) -> None:
        thread = self._mlflow_thread
        if thread is not None and thread is not threading.current_thread():
            self._mlflow_address.wait(ADDRESS_WAIT_S)  # the record is final when the cell ends
        self.record = html_view.record_html(
            self.view, label=self._label, pending=self._dead_links()
        )
        if self._display is not None:
            bundle = {"text/html": self.record, "text/plain": self.text()}
            self._display.update(bundle, raw=True)

    # -- results and cancel ---------------------------------------------------------------

    def show_results(self, descriptions: list[str]) -> None:
        self.view.set_results(descriptions)
        self._publish_record()

    def abandon(self, message: str) -> None:
        self.view.failed_to_start(message)
        self._finish()

    def _on_cancel(self, _button: widgets.Button) -> None:
        if self.view.done:
            return
        self._cancel_clicks += 1
        self._note = "cancelling"
        if self._stop_grace > 0 and self._cancel_clicks == 1:
            # The ranks are asked to stop and have stop_grace to return; a second click kills.
            self.cancel_button.description = "Kill now"
            self.cancel_button.tooltip = (
                f"The ranks were asked to stop (runtime.should_stop()) and have "
                f"{self._stop_grace:g} s to return; click to stop them at once"
            )
        else:
            self.cancel_button.disabled = True
            self.cancel_button.description = "Cancelling..."
        self._draw_header()
        if self._in_tick:
            # A click handled inside the wait loop: cancel once the pump has returned, from the
            # waiting thread (cancelling dispatches events to this renderer).
            self._cancel_pending = True
        else:
            self._cancel(CANCEL_REASON)

    def _on_stacks(self, _button: widgets.Button) -> None:
        if self.view.done:
            return
        self.stacks_button.disabled = True
        self.stacks_button.description = "Taking stacks..."
        self.stacks_summary.value = stacks_view.busy_html()
        self.live.say("taking every rank's stacks")
        if self._in_tick:
            self._stacks_pending = True  # taken once the pump has returned (as Cancel is)
        else:
            self._show_stacks()

    def _show_stacks(self) -> None:
        """Take every rank's stacks (about a second) and show them in each rank's tab."""
        try:
            texts = self._take_stacks()
        finally:
            self.stacks_button.disabled = False
            self.stacks_button.description = "Stacks"
        view = self.view
        found = stacks_view.take(texts, view.world_size, view.paths, self._label)
        view.stacks = found
        self.stacks_summary.value = stacks_view.summary_html(found)
        for rank, box in enumerate(self.stack_boxes):
            box.value = stacks_view.stacks_html(rank, found, self._label)
        self.live.say(f"stacks taken{': ' + found.verdict if found.verdict else ''}")

    def _on_open_mlflow(self, _button: widgets.Button) -> None:
        """The retry of a UI that did not start."""
        if self._mlflow_thread is None or not self._mlflow_thread.is_alive():
            self._start_mlflow_ui()
            self._draw_header()

    def _start_mlflow_ui(self) -> None:
        """Start the MLflow UI on its own thread (it takes seconds) as soon as the run has its
        MLflow link: the link opens by the time anyone clicks it, and the kernel stays free."""
        self._mlflow_pending = "starting the MLflow UI..."
        self._mlflow_address.clear()
        self.mlflow_button.layout.display = "none"
        self._mlflow_thread = threading.Thread(
            target=self._serve_mlflow, name="serverless-gpu-mlflow-ui", daemon=True
        )
        self._mlflow_thread.start()

    def _serve_mlflow(self) -> None:
        from serverless_gpu.tracking import ui

        try:
            ui(on_address=self._link_address)
        except Exception as exc:  # said in the header and on the button; the run goes on
            self._mlflow_pending = _UI_FAILED
            self.mlflow_button.description = "Retry MLflow UI"
            self.mlflow_button.tooltip = f"{type(exc).__name__}: {exc}"
            kept = not self.view.done or self._button_display is not None
            self.mlflow_button.layout.display = None if kept else "none"
        else:
            self._mlflow_pending = ""
            self._drop_kept_button()
        finally:
            self._mlflow_address.set()
        if self.view.done:
            self._publish_record()  # a run that ended while the UI started: its record links it
        else:
            self._draw_header()

    def _link_address(self, address: str) -> None:
        """The UI's address, known before it answers: it may have had to take another port
        than the one the link names."""
        page = f"{address}/#{urlsplit(self.view.links['mlflow']).fragment}"
        self.view.links["mlflow"] = page
        self._mlflow_address.set()

    def _drop_kept_button(self) -> None:
        if self._button_display is not None:
            self._button_display.update({"text/plain": ""}, raw=True)
            self._button_display = None
            self.mlflow_button.close()

    def text(self) -> str:
        return snapshot_text(self.view)
