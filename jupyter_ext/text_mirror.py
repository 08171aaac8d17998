"""A running run's latest lines as text, for frontends that draw no widgets.

A ``jupyter_client`` driver, a console or an editor without ipywidgets sees only the run
widget's text/plain form, written once as it appears: none of the ranks' output while the run
goes on. The widget's own display cannot be updated instead: JupyterLab's widget renderer builds
a new view of the widget at each update (lost focus, scroll and tab state, a redraw of
everything). So the lines go to a display of their own, created at the first line and updated
at most every ``min_interval`` seconds, holding a bounded tail: text/plain for text frontends,
and the same text as HTML in an element that the widget's style sheet hides (a page that draws
the widget has loaded it, see ``live_status``; one that draws no widget never does). When the
run ends the display is emptied: the record, in the widget's place, holds the last lines.
"""

from __future__ import annotations

import html
import threading
import time

from IPython.display import DisplayHandle, display

from .formatting import snapshot_text
from .runstate import RunView

MIN_INTERVAL_S = 0.5
TAIL_LINES = 40
"""Lines shown across all ranks (each rank gets its share, at least two)."""
HIDDEN_CLASS = "sgpu-text-live"
"""Hidden by the widget's style sheet (``live_status._CSS``)."""


class TextMirror:
    """The text form of one run's live output, kept in its own display."""

    def __init__(
        self, view: RunView, *, enabled: bool = True, min_interval: float = MIN_INTERVAL_S
    ) -> None:
        self.view = view
        self.enabled = enabled
        self.min_interval = min_interval
        self._owner = threading.get_ident()
        """The cell's thread: only it creates the display (one made from a background poll
        would land in whatever cell runs then)."""
        self._display: DisplayHandle | None = None
        self._shown = -1
        self._last = 0.0

    def refresh(self) -> None:
        """Show the latest lines if some came since and ``min_interval`` has passed."""
        view = self.view
        if not self.enabled or view.done or self._shown == view.version or not _printed(view):
            return
        now = time.monotonic()
        if now - self._last < self.min_interval:
            return
        if self._display is None and threading.get_ident() != self._owner:
            return
        self._last, self._shown = now, view.version
        self._show(self._bundle(_tail(view)))

    def clear(self) -> None:
        """The run ended: the record holds its last lines, this display holds nothing."""
        if self._display is not None:
            self._display.update({"text/plain": ""}, raw=True)
            self._display = None

    def _show(self, bundle: dict[str, str]) -> None:
        if self._display is None:
            self._display = display(bundle, raw=True, display_id=True)
        else:
            self._display.update(bundle, raw=True)

    @staticmethod
    def _bundle(text: str) -> dict[str, str]:
        shown = f'<pre class="{HIDDEN_CLASS}">{html.escape(text)}</pre>'
        return {"text/plain": text, "text/html": shown}


def _printed(view: RunView) -> bool:
    return any(r.line_count or r.provisional for r in view.ranks)


def _tail(view: RunView) -> str:
    per_rank = max(2, TAIL_LINES // max(1, len(view.ranks)))
    return snapshot_text(view, tail=per_rank)
