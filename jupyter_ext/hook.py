"""The run hook: every run started from IPython gets a widget or a text renderer.

In a kernel the run is drawn as a widget. A kernel cannot tell whether its client renders
widgets (the widget manager's handshake happens when the client connects, usually before this
extension is loaded, and ends with the comm closed), so the widget carries a text/plain form
with the header, each rank's last lines and the summary: what nbclient, nbconvert and static
viewers show. Terminal IPython gets the text renderer; ``SERVERLESS_GPU_DISPLAY`` = ``text`` /
``widget`` overrides the choice.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from serverless_gpu.events import Event
from serverless_gpu.hooks import RunContext

from .text_renderer import TextRenderer

RENDER_HOOK_ORDER = 5
"""Before tracking (order 10), whose MLflow run takes seconds to create: the widget shows the
run as starting at once. Links added later are drawn as they come (``ctx.links`` is shared)."""
HOOKS_DONE_ORDER = 1000
"""After every other hook: the run waits for the launcher next."""
DISPLAY_ENV = "SERVERLESS_GPU_DISPLAY"
_KEEP_RECENT = 16


class Renderer(Protocol):
    def __call__(self, event: Event) -> None: ...

    def show_results(self, descriptions: list[str]) -> None:
        """Add each rank's result type and shape to the summary."""


_recent: OrderedDict[str, tuple[Path, Renderer]] = OrderedDict()


def render_run(ctx: RunContext) -> Renderer | None:
    """Run hook: show this run in the notebook (or terminal) it was started from."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return None  # a plain script: the core's console printer is the right display
    renderer: Renderer = TextRenderer(ctx)
    if widgets_wanted(shell):
        try:
            from .widget import WidgetRenderer

            renderer = WidgetRenderer(ctx, shell)
        except Exception as exc:  # a display problem must not stop the run: show it as text
            print(f"serverless_gpu: no run widget ({type(exc).__name__}: {exc})")
    ctx.display_claimed = True
    _recent[ctx.run_id] = (ctx.run_dir, renderer)
    while len(_recent) > _KEEP_RECENT:
        _recent.popitem(last=False)
    return renderer


def hooks_done(ctx: RunContext) -> None:
    """Run hook, last: tell the run's renderer that the launcher is what the run waits for."""
    entry = _recent.get(ctx.run_id)
    set_phase = getattr(entry[1], "set_phase", None) if entry is not None else None
    if set_phase is not None:
        set_phase("launcher")


def renderer_for(run_id: str | None = None, run_dir: Path | None = None) -> Renderer | None:
    """The renderer of a recent run, by id or directory (the magic completes its summary)."""
    for key, (directory, renderer) in reversed(_recent.items()):
        if key == run_id or (run_dir is not None and directory == run_dir):
            return renderer
    return None


def widgets_wanted(shell: Any) -> bool:
    mode = os.environ.get(DISPLAY_ENV, "auto").strip().lower()
    if mode == "text" or getattr(shell, "kernel", None) is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True
