"""A running run's latest lines as text, for frontends that draw no widgets.

A ``jupyter_client`` driver, a console or an editor without ipywidgets shows only the run
widget's text/plain form, written once as the widget appears: nothing of the ranks' output
while the run goes on. The widget's own display cannot carry the lines instead: JupyterLab
builds a new view of a widget at each update of its display (focus, scroll and tabs lost).

So the lines go to a display of their own, created at the first line (in the cell that started
the run) and updated at most every ``min_interval`` seconds with a bounded tail. Its bundle
has the same two parts as the widget's: text/plain, and a widget view with no model
(``model_id`` ""), which the widget manager of JupyterLab and Notebook 7 renders as a hidden
node. So a page that draws widgets shows nothing of it (no style sheet needed, nothing twice),
and a frontend that draws none shows the text, as it shows the widget's. When the run ends the
display is updated to an empty bundle: no text, no HTML, no widget. A saved notebook keeps an
output with no data there, which JupyterLab, nbconvert and the record's readers skip; the
record, in the widget's place, holds each rank's last lines.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from IPython.display import DisplayHandle, display

from .formatting import snapshot_text
from .runstate import RunView

MIN_INTERVAL_S = 0.5
TAIL_LINES = 40
"""Lines shown across all ranks (each rank gets its share, at least two)."""
MAX_CHARS = 8000
"""Of the text shown (its end): a rank's very long lines do not make a large message."""
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NO_WIDGET = {"version_major": 2, "version_minor": 0, "model_id": ""}
"""A view of no model: the widget manager hides it (``renderModel`` in jupyterlab_widgets)."""


class LiveText:
    """The text form of one run's live output, kept in a display of its own."""

    def __init__(
        self,
        view: RunView,
        shell: Any = None,
        *,
        enabled: bool = True,
        min_interval: float = MIN_INTERVAL_S,
    ) -> None:
        self.view = view
        self.enabled = enabled
        self.min_interval = min_interval
        self._shell = shell
        self._cell = self._where()
        """The thread and cell that started the run: only they create the display (one made
        later, from another cell or thread, would land in whatever cell runs then)."""
        self._lock = threading.Lock()
        self._display: DisplayHandle | None = None
        self._shown = -1
        self._last = 0.0

    def refresh(self) -> None:
        """Show the latest lines, if some came since and ``min_interval`` has passed."""
        view = self.view
        if not self.enabled or view.done or self._shown == view.version or not _printed(view):
            return
        now = time.monotonic()
        if now - self._last < self.min_interval:
            return  # the next tick shows them: the lines are never older than the interval
        with self._lock:
            if view.done or (self._display is None and self._where() != self._cell):
                return
            self._last, self._shown = now, view.version
            bundle = {WIDGET_VIEW: NO_WIDGET, "text/plain": tail_text(view)}
            if self._display is None:
                self._display = display(bundle, raw=True, display_id=True)
            else:
                self._display.update(bundle, raw=True)

    def clear(self) -> None:
        """The run ended: its display holds nothing (the record holds the last lines)."""
        with self._lock:
            self.enabled = False
            if self._display is not None:
                self._display.update({}, raw=True)
                self._display = None

    def _where(self) -> tuple[int, object]:
        return threading.get_ident(), getattr(self._shell, "execution_count", None)


def _printed(view: RunView) -> bool:
    return any(r.line_count or r.provisional for r in view.ranks)


def tail_text(view: RunView) -> str:
    """The header and each rank's last lines, at most ``TAIL_LINES`` of them in all (two a
    rank at least) and ``MAX_CHARS`` characters."""
    per_rank = max(2, TAIL_LINES // max(1, len(view.ranks)))
    text = snapshot_text(view, tail=per_rank)
    return text if len(text) <= MAX_CHARS else "..." + text[-MAX_CHARS:]
