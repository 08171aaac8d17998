"""The live run widget: header with status and links, Cancel, one tab per rank, summary.

Events only update the :class:`RunView`; the widget is redrawn at most every
``min_interval`` seconds (and on state changes), so a rank printing 100,000 lines costs the
browser a few redraws per second of bounded size, and costs the rank nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
from IPython.display import DisplayHandle, display

from serverless_gpu.events import OutputLines, RunFinished
from serverless_gpu.hooks import RunContext

from . import html_view
from .formatting import snapshot_text
from .runstate import RunView
from .uipoll import UiPump

MIN_INTERVAL_S = 0.25
_HEADER_INTERVAL_S = 1.0
CANCEL_REASON = "cancelled from the notebook widget"


class RunWidget(widgets.VBox):
    """A VBox whose ``text/plain`` form is the run's readable summary (static viewers)."""

    def __init__(self, text: Callable[[], str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle: dict[str, Any] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = self._text()
        return bundle


class WidgetRenderer:
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
        self._cancel_pending = False
        self._in_tick = False
        ctx.idle_callbacks.append(self.tick)
        self._pump = UiPump(shell)
        self._note = ""
        self._drawn: dict[int, int] = {}
        self._last_draw = 0.0
        self._last_header = 0.0
        self._build()
        self._display: DisplayHandle | None = None
        if show:
            self._display = display(self.widget, display_id=True)

    def _build(self) -> None:
        view = self.view
        self.header = widgets.HTML(html_view.header_html(view))
        self.cancel_button = widgets.Button(
            description="Cancel",
            button_style="danger",
            icon="stop",
            tooltip="Stop every rank of this run",
        )
        self.cancel_button.on_click(self._on_cancel)
        self.outputs = [widgets.HTML(html_view.rank_output_html(view, r)) for r in view.ranks]
        self.tabs = widgets.Tab(
            children=self.outputs, titles=tuple(html_view.tab_title(r) for r in view.ranks)
        )
        self.summary = widgets.HTML("", layout=widgets.Layout(display="none"))
        top = widgets.HBox(
            [self.header, self.cancel_button],
            layout=widgets.Layout(justify_content="space-between", align_items="flex-start"),
        )
        self.widget = RunWidget(
            self.text, children=[top, self.tabs, self.summary], _dom_classes=["sgpu-run"]
        )

    # -- events and ticks (the waiting thread) --------------------------------------------

    def __call__(self, event: object) -> None:
        if not self.view.apply(event):
            return
        if isinstance(event, RunFinished):
            self._finish()
        else:
            self._refresh(force=not isinstance(event, OutputLines))

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
        self._refresh(force=False)

    def _refresh(self, *, force: bool) -> None:
        now = time.monotonic()
        due = now - self._last_draw >= self.min_interval
        if force or (due and self._dirty()):
            self._draw()
            return
        if now - self._last_header >= _HEADER_INTERVAL_S:
            self._draw_header()

    def _dirty(self) -> bool:
        return any(self._drawn.get(r.rank) != r.version for r in self.view.ranks)

    def _draw_header(self) -> None:
        self._last_header = time.monotonic()
        self.header.value = html_view.header_html(self.view, note=self._note)

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        self._draw_header()
        for rank, output in zip(self.view.ranks, self.outputs, strict=True):
            if self._drawn.get(rank.rank) != rank.version:
                self._drawn[rank.rank] = rank.version
                output.value = html_view.rank_output_html(self.view, rank)
        titles = tuple(html_view.tab_title(r) for r in self.view.ranks)
        if tuple(self.tabs.titles) != titles:
            self.tabs.titles = titles

    def _finish(self) -> None:
        self._pump.close()
        self._note = ""
        self._draw()
        self.cancel_button.disabled = True
        self.cancel_button.layout.display = "none"
        self._draw_summary()

    def _draw_summary(self) -> None:
        self.summary.value = html_view.summary_html(self.view)
        self.summary.layout.display = None
        if self._display is not None:
            # Re-publish so that the saved output's text/plain is the final summary.
            self._display.update(self.widget)

    # -- results and cancel ---------------------------------------------------------------

    def show_results(self, descriptions: list[str]) -> None:
        self.view.set_results(descriptions)
        self._draw_summary()

    def show_error(self, rank: int, text: str) -> None:
        self.view.set_error(rank, text)
        self._draw_summary()

    def _on_cancel(self, _button: widgets.Button) -> None:
        if self.view.done:
            return
        self._note = "cancelling"
        self.cancel_button.disabled = True
        self.cancel_button.description = "Cancelling..."
        self._draw_header()
        if self._in_tick:
            # A click handled inside the wait loop: cancel once the pump has returned, from the
            # waiting thread (cancelling dispatches events to this renderer).
            self._cancel_pending = True
        else:
            self._cancel(CANCEL_REASON)

    def text(self) -> str:
        return snapshot_text(self.view)
